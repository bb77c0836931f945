-- POST the JSON body in $BENCH_BODY with $BENCH_AUTH as the bearer key (empty: none).
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
local auth = os.getenv("BENCH_AUTH")
if auth ~= nil and auth ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. auth
end

done = function(summary, latency, requests)
  io.write(string.format("BENCH p50_us=%d p99_us=%d requests=%d non2xx=%d errors=%d duration_us=%d\n",
    latency:percentile(50), latency:percentile(99), summary.requests,
    summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration))
end
