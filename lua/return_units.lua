-- return_units.lua: give the units of closed orders (cancelled, expired) back
-- to a sku's sale, each order once.
--
-- Keys, channels and record formats are gateway/redis/layout.py's.
--
-- KEYS[1] stock, KEYS[2] buyers (as in reserve.lua)
-- KEYS[3] returned  hash: request_id -> "1" for every order returned
-- ARGV[1] pub/sub channel, ARGV[2] sku
-- ARGV[3] retention in ms: the keys are kept that long after a return
-- ARGV[4..] groups of three: request_id, user_id, qty
--
-- An order already in returned is skipped, so a return applied twice (a retry,
-- a sweep after a crash, two gateways) adds its units once. A missing counter
-- is left missing: its reload reads the database's stock, which counts every
-- return not yet given to Redis as owed (gateway.postgres.orders.SKU_STOCK),
-- and this one is then given. The buyer leaves the buyers hash when it still
-- names this order, so they may buy again. Publishes "avail:<sku>" when a unit
-- came back, so every gateway drops its sold-out mark.
-- Returns the number of orders returned now.
local counter = redis.call("EXISTS", KEYS[1]) == 1
local given, units = 0, 0
for i = 4, #ARGV, 3 do
  local rid, user, qty = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if redis.call("HSETNX", KEYS[3], rid, "1") == 1 then
    given = given + 1
    units = units + qty
    if redis.call("HGET", KEYS[2], user) == rid then
      redis.call("HDEL", KEYS[2], user)
    end
  end
end
if given > 0 then
  if counter then
    redis.call("INCRBY", KEYS[1], units)
    redis.call("PEXPIRE", KEYS[1], ARGV[3])
  end
  redis.call("PEXPIRE", KEYS[3], ARGV[3])
  redis.call("PUBLISH", ARGV[1], "avail:" .. ARGV[2])
end
return given
