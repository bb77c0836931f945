-- POST the JSON body in $BENCH_BODY with $BENCH_AUTH as the bearer key (empty: none) and the
-- "Name: value" lines of $BENCH_HEADERS (a peer gateway's routing headers).
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
local auth = os.getenv("BENCH_AUTH")
if auth ~= nil and auth ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. auth
end
local extra = os.getenv("BENCH_HEADERS")
if extra ~= nil then
  for line in extra:gmatch("[^\n]+") do
    local name, value = line:match("^([^:]+):%s*(.*)$")
    if name ~= nil then
      wrk.headers[name] = value
    end
  end
end

done = function(summary, latency, requests)
  io.write(string.format("BENCH p50_us=%d p99_us=%d requests=%d non2xx=%d errors=%d duration_us=%d\n",
    latency:percentile(50), latency:percentile(99), summary.requests,
    summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration))
end
