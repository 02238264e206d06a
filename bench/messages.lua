-- wrk script: a non-streaming Anthropic Messages request, and a JSON summary at the end.
wrk.method = "POST"
wrk.body = '{"model": "bench-model", "max_tokens": 256, "messages": [{"role": "user", "content": "hi"}]}'
wrk.headers["Content-Type"] = "application/json"
-- As Anthropic's clients send the key, with the API version they speak.
wrk.headers["x-api-key"] = os.getenv("BENCH_KEY") or "sk-bench"
wrk.headers["anthropic-version"] = "2023-06-01"

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
