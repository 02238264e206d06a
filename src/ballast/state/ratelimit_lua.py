"""The two Lua scripts Redis runs for the rate limiter: one judges a turn's acquires for a
key (after applying its deferred releases), the other applies releases alone. Their SHA1s
are what `EVALSHA` names.

Why apart: they are a protocol with Redis (the order of KEYS and ARGV, the shape of a
reply) that the Python side must match, and they read best whole. The counters and lease
sets they keep are described in `ratelimit.py`.
"""

from __future__ import annotations

import hashlib
from typing import Final

# KEYS: counters hash, parallel lease set.
# ARGV: rpm, tpm, max_parallel (-1 = not enforced), lease ttl (ms), n, then n acquires of
#       two values each (cost, lease id), then releases to apply first, three values each:
#       lease id ('' none), the window number its tokens were booked in, token delta.
# Returns n replies, one per acquire in order: reason (0 admitted, 1 requests, 2 tokens,
#         3 parallel), window number, ms into the window, rc, rp, tc, tp (after it), leases
#         in flight, retry after (ms). Each acquire is judged after the ones before it, as
#         if each had run a script of its own; the counters are read and written once.
# Applies the releases in ARGV from index `first` on (KEYS as above).
_APPLY_RELEASES: Final = """
local function apply_releases(first)
  for i = first, #ARGV, 3 do
    if ARGV[i] ~= '' then redis.call('ZREM', KEYS[2], ARGV[i]) end
    local d = tonumber(ARGV[i + 2])
    if d ~= 0 then
      local w = tonumber(redis.call('HGET', KEYS[1], 'w'))
      local booked = tonumber(ARGV[i + 1])
      local f = nil
      if w == booked then f = 'tc' elseif w == booked + 1 then f = 'tp' end
      if f then
        local v = (tonumber(redis.call('HGET', KEYS[1], f)) or 0) + d
        if v < 0 then v = 0 end
        redis.call('HSET', KEYS[1], f, v)
      end
    end
  end
end
"""

ACQUIRE_LUA: Final = (
    _APPLY_RELEASES
    + """
local n = tonumber(ARGV[5])
apply_releases(6 + 2 * n)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local W = 60000
local rpm, tpm, par = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local win = math.floor(now / W)
local into = now - win * W
local weight = (W - into) / W
local rc, rp, tc, tp = 0, 0, 0, 0
local counted = rpm >= 0 or tpm >= 0
if counted then
  local h = redis.call('HMGET', KEYS[1], 'w', 'rc', 'rp', 'tc', 'tp')
  local w = tonumber(h[1])
  if w == win then
    rc, rp = tonumber(h[2]) or 0, tonumber(h[3]) or 0
    tc, tp = tonumber(h[4]) or 0, tonumber(h[5]) or 0
  elseif w == win - 1 then
    rp, tp = tonumber(h[2]) or 0, tonumber(h[4]) or 0
  end
end
local inflight = 0
if par >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  inflight = redis.call('ZCARD', KEYS[2])
end
-- ms until p * (W - e) / W + c + need <= limit, e the time into the window
local function wait(p, c, need, limit)
  if limit <= 0 then return W end
  local room = limit - c - need
  if room >= 0 then
    return math.max(1, math.ceil(W * (1 - room / p)) - into)
  end
  return (W - into) + math.max(0, math.ceil(W * (1 - (limit - need) / c)))
end
local out = {}
local booked, leased = false, false
for i = 0, n - 1 do
  local cost = tonumber(ARGV[6 + 2 * i])
  local reason, retry = 0, 0
  if par >= 0 and inflight >= par then
    reason, retry = 3, 1000
  elseif rpm >= 0 and (rpm <= 0 or rp * weight + rc + 1 > rpm) then
    reason, retry = 1, wait(rp, rc, 1, rpm)
  elseif tpm >= 0 then
    local need = math.min(cost, tpm)
    if tpm <= 0 or tp * weight + tc + need > tpm then
      reason, retry = 2, wait(tp, tc, need, tpm)
    end
  end
  if reason == 0 then
    if counted then
      rc, tc = rc + 1, tc + cost
      booked = true
    end
    if par >= 0 then
      redis.call('ZADD', KEYS[2], now + ttl, ARGV[7 + 2 * i])
      inflight = inflight + 1
      leased = true
    end
  end
  out[i + 1] = {reason, win, into, rc, rp, tc, tp, inflight, retry}
end
if booked then
  redis.call('HSET', KEYS[1], 'w', win, 'rc', rc, 'rp', rp, 'tc', tc, 'tp', tp)
  redis.call('PEXPIRE', KEYS[1], 2 * W + 1000)
end
if leased then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return out
"""
)

# KEYS: counters hash, parallel lease set. ARGV: releases, three values each (as above).
RELEASE_LUA: Final = (
    _APPLY_RELEASES
    + """
apply_releases(1)
return 0
"""
)

_ACQUIRE_SHA: Final = hashlib.sha1(ACQUIRE_LUA.encode()).hexdigest()
_RELEASE_SHA: Final = hashlib.sha1(RELEASE_LUA.encode()).hexdigest()
