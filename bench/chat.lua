-- wrk script: a non-streaming request (a chat completion unless told), and a JSON summary.
wrk.method = "POST"
-- BENCH_BODY: the same request on another API shape (load.SHAPES); the chat one by default.
wrk.body = os.getenv("BENCH_BODY") or
   '{"model": "bench-model", "messages": [{"role": "user", "content": "hi"}]}'
wrk.headers["Content-Type"] = "application/json"
-- The key comes from BENCH_KEY (a virtual key for the keys+limits+spend variants), as a
-- bearer token or in the header BENCH_KEY_HEADER names (x-api-key for Anthropic's API).
local key = os.getenv("BENCH_KEY") or "sk-bench"
local key_header = os.getenv("BENCH_KEY_HEADER")
if key_header then
   wrk.headers[key_header] = key
else
   wrk.headers["Authorization"] = "Bearer " .. key
end
-- Headers a target needs on every request (Portkey's name the upstream): "name: value|...".
for pair in string.gmatch(os.getenv("BENCH_HEADERS") or "", "[^|]+") do
   local name, value = string.match(pair, "^([^:]+):%s*(.*)$")
   if name then wrk.headers[name] = value end
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      'BENCH_JSON {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
      '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "mean_us": %.1f, ' ..
      '"err_connect": %d, "err_read": %d, "err_write": %d, "err_status": %d, ' ..
      '"err_timeout": %d}\n',
      summary.requests, summary.duration, summary.bytes,
      latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency.max, latency.mean,
      e.connect, e.read, e.write, e.status, e.timeout))
end
