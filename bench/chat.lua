-- wrk script: a non-streaming chat completion request, and a JSON summary at the end.
wrk.method = "POST"
wrk.body = '{"model": "bench-model", "messages": [{"role": "user", "content": "hi"}]}'
wrk.headers["Content-Type"] = "application/json"
-- The key comes from BENCH_KEY: a virtual key for the keys+limits+spend variants.
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BENCH_KEY") or "sk-bench")
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
