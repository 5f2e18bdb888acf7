-- rebuild.lua: write a sku's buyers and done hashes back from PostgreSQL's
-- orders, once across the fleet, under a lease held in the rebuild key.
--
-- Keys and record formats are gateway/redis/layout.py's.
--
-- KEYS[1] rebuild  string: "owner|lease_until_ms" (as in reserve.lua); its
--                  presence says the two hashes are incomplete
-- KEYS[2] buyers, KEYS[3] done (as in reserve.lua)
-- ARGV[1] step: "take", "write" or "finish"
-- ARGV[2] the caller's owner id, ARGV[3] lease in ms, ARGV[4] retention in ms
-- ARGV[5..] "write" only: three per order: request_id, done record
--           ("order_id|user_id|qty"), user_id
--
-- "take" gives the lease to the caller when nobody holds it (load_stock.lua
-- flags a sku with "|0") or its holder's lease ran out (the holder died or
-- stalled: another instance goes on where it stopped, the writes being
-- idempotent); 0 when the sku is not rebuilding or another holds it.
-- "write" puts one chunk of orders into both hashes in one step (a reservation
-- never sees an order's buyer without its request id) and renews the lease;
-- 0, writing nothing, when the caller does not hold it any more.
-- "finish" deletes the key: reservations trust the hashes again; 0 when the
-- caller does not hold it.
-- The lease is checked against this Redis's TIME: one clock for every instance.
-- Returns 1 or 0 as above.
local time = redis.call("TIME")
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local held = redis.call("GET", KEYS[1])
if not held then
  return 0
end
local owner, until_ms = string.match(held, "^(.*)|(%d+)$")
local mine = owner == ARGV[2]
if ARGV[1] == "take" then
  if not mine and tonumber(until_ms) > now then
    return 0
  end
elseif not mine then
  return 0
elseif ARGV[1] == "finish" then
  redis.call("DEL", KEYS[1])
  return 1
else
  local done, buyers = {}, {}
  for i = 5, #ARGV, 3 do
    done[#done + 1] = ARGV[i]
    done[#done + 1] = ARGV[i + 1]
    buyers[#buyers + 1] = ARGV[i + 2]
    buyers[#buyers + 1] = ARGV[i]
  end
  if #done > 0 then
    redis.call("HSET", KEYS[3], unpack(done))
    redis.call("HSET", KEYS[2], unpack(buyers))
    redis.call("PEXPIRE", KEYS[2], ARGV[4])
    redis.call("PEXPIRE", KEYS[3], ARGV[4])
  end
end
redis.call("SET", KEYS[1], ARGV[2] .. "|" .. (now + tonumber(ARGV[3])), "PX", ARGV[4])
return 1
