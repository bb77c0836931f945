-- POST the JSON body in $BENCH_BODY with $BENCH_AUTH as the bearer key (empty: none; several keys
-- separated by commas: each request takes the next) and the "Name: value" lines of $BENCH_HEADERS
-- (a peer gateway's routing headers).
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
local auth = os.getenv("BENCH_AUTH")
local keys = {}
if auth ~= nil then
  for key in auth:gmatch("[^,]+") do
    table.insert(keys, key)
  end
end
if #keys > 0 then
  wrk.headers["Authorization"] = "Bearer " .. keys[1]
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

if #keys > 1 then
  local turn = 0
  request = function()
    turn = turn % #keys + 1
    local headers = {}
    for name, value in pairs(wrk.headers) do
      headers[name] = value
    end
    headers["Authorization"] = "Bearer " .. keys[turn]
    return wrk.format(nil, nil, headers, nil)
  end
end

done = function(summary, latency, requests)
  io.write(string.format("BENCH p50_us=%d p99_us=%d requests=%d non2xx=%d errors=%d duration_us=%d\n",
    latency:percentile(50), latency:percentile(99), summary.requests,
    summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration))
end
