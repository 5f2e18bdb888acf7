-- settle.lua: apply a flushed batch's outcomes to Redis after PostgreSQL decided.
--
-- Keys, channels and record formats are gateway/redis/layout.py's; the verdict
-- letters are gateway.domain.model.Verdict's (an expired "X" arrives as "R").
--
-- KEYS[1] stock, KEYS[2] buyers, KEYS[3] pending, KEYS[4] done, KEYS[5] rebuild
--         (as in reserve.lua)
-- ARGV[1] pub/sub channel, ARGV[2] sku
-- ARGV[3] database stock after the batch, or -1 when the batch did not find
--         the database short of stock
-- ARGV[4] retention in ms: the sku's keys are kept that long after this settle
-- ARGV[5..] groups of five: request_id, verdict, user_id, qty, order_id
--   verdict "C" confirmed:  leaves the ledger, recorded in done
--   verdict "R" released:   leaves the ledger; its stock and buyer go back
--   verdict "S" sold out:   the database had too little; leaves the ledger and
--                           frees the buyer, but the stock is not given back
--   verdict "D" duplicate:  the database already holds this user's order;
--                           leaves the ledger, its stock goes back, buyer kept
--
-- Stock is given back only when the ledger entry was still there, so settling
-- twice (a retry, or the reconciler first) never returns stock twice; and only
-- onto an existing stock key, since a missing key is reloaded from the
-- database, which already counts it. When the database was short, Redis ran
-- ahead of it: stock is lowered to database stock minus what is still pending.
-- Redis only runs ahead when it lost writes (a replica promoted without the
-- newest reservations and settles): the buyers and done hashes may miss
-- committed orders too, so the sku is flagged as rebuilding (as load_stock.lua
-- does for a lost counter) unless a rebuild is under way, and "meta:<sku>"
-- drops every gateway's sold-out mark, whose filter came from that done hash.
-- Publishes "avail:<sku>" when stock goes from 0 to more.
-- Returns the stock left, or -1 when the stock key is missing.
local has_stock = redis.call("EXISTS", KEYS[1]) == 1
local before = has_stock and tonumber(redis.call("GET", KEYS[1])) or -1

for i = 5, #ARGV, 5 do
  local rid, verdict, user, qty = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local held = redis.call("HDEL", KEYS[3], rid) == 1
  if verdict == "C" then
    redis.call("HSET", KEYS[4], rid, ARGV[i + 4] .. "|" .. user .. "|" .. qty)
    redis.call("HSET", KEYS[2], user, rid)
  else
    if verdict ~= "D" and redis.call("HGET", KEYS[2], user) == rid then
      redis.call("HDEL", KEYS[2], user)
    end
    if verdict == "D" then
      redis.call("HSETNX", KEYS[2], user, rid)
    end
    if held and has_stock and verdict ~= "S" then
      redis.call("INCRBY", KEYS[1], qty)
    end
  end
end

for i = 1, 4 do
  redis.call("PEXPIRE", KEYS[i], ARGV[4])
end
if not has_stock then
  return -1
end
local db_after = tonumber(ARGV[3])
if db_after >= 0 then
  local pending = 0
  for _, entry in ipairs(redis.call("HVALS", KEYS[3])) do
    pending = pending + tonumber(string.match(entry, "^[^|]*|([^|]*)|"))
  end
  local ceiling = math.max(db_after - pending, 0)
  if tonumber(redis.call("GET", KEYS[1])) > ceiling then
    redis.call("SET", KEYS[1], ceiling)
  end
  if redis.call("SET", KEYS[5], "|0", "PX", ARGV[4], "NX") then
    redis.call("PUBLISH", ARGV[1], "meta:" .. ARGV[2])
  end
end
local after = tonumber(redis.call("GET", KEYS[1]))
if before <= 0 and after > 0 then
  redis.call("PUBLISH", ARGV[1], "avail:" .. ARGV[2])
end
return after
