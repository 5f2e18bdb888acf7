-- purchase.lua: wrk script posting POST /v1/purchase bodies for loadtests/bench.py.
--
-- Usage: wrk -s loadtests/lib/purchase.lua URL -- SKU TAG
-- Every request is a new shopper: user_id and request_id are "<TAG>-<thread>-<n>",
-- so with per_user_limit 1 and a large stock nearly every request gets 201.
-- wrk counts 409 among "non-2xx/3xx", so statuses are counted here, per thread,
-- in response(); done() prints one line "WRK_JSON {...}" that bench.py parses.

local threads = {}
local next_id = 1

function setup(thread)
  thread:set("tid", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  sku = args[1] or "sku"
  tag = args[2] or "t"
  n = 0
  statuses = {}
  headers = { ["Content-Type"] = "application/json" }
  head = '{"sku":"' .. sku .. '","user_id":"u' .. tag .. "-" .. tid .. "-"
end

function request()
  n = n + 1
  local id = tag .. "-" .. tid .. "-" .. n
  return wrk.format("POST", "/v1/purchase", headers, head .. n .. '","request_id":"r' .. id .. '"}')
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local merged = {}
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("statuses")) do
      merged[status] = (merged[status] or 0) + count
    end
  end
  local parts = {}
  for status, count in pairs(merged) do
    table.insert(parts, string.format('"%d":%d', status, count))
  end
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"mean":%.1f,"max":%d,"p50":%d,"p90":%d,"p99":%d,"p999":%d},' ..
    '"statuses":{%s}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency.max,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9),
    table.concat(parts, ",")))
end
