-- append_events.lua: append one claim's order events to the event stream, in
-- one call (gateway/redis/event_stream.py, the relay's stream sink, when its
-- events come as fields: on a Redis Cluster).
--
-- KEYS[1] the stream (GATEWAY_EVENTS_STREAM)
-- ARGV[1] the trim that rides on the last XADD: "" none, else "MAXLEN" or
--         "MINID" (approximate: "~", whole macro nodes)
-- ARGV[2] the trim's threshold (read only with a trim)
-- ARGV[3..] per event, in the claim's order: n, then the n strings of its
--         fields (name, value, ...; gateway.domain.events.OrderEvent.fields)
-- Returns the id of the last entry appended.
--
-- Why a script on a cluster: redis-py's cluster pipeline packs and reads each
-- command in Python: that cost the gateway more per XADD than the
-- script's call of XADD costs Redis (issue 42). On one Redis the events come
-- packed by PostgreSQL and go as plain XADDs, cheaper for both. A failure
-- part-way leaves the entries before it appended; the relay then sends the
-- whole claim again, so a consumer may see an event twice, with its one
-- event_id: delivery is at least once, as documented.
local key, last = KEYS[1], nil
local trim, threshold = ARGV[1], ARGV[2]
local i, n = 3, #ARGV
while i <= n do
  local count = tonumber(ARGV[i])
  local after = i + count + 1
  if trim ~= '' and after > n then
    last = redis.call('XADD', key, trim, '~', threshold, '*', unpack(ARGV, i + 1, i + count))
  else
    last = redis.call('XADD', key, '*', unpack(ARGV, i + 1, i + count))
  end
  i = after
end
return last
