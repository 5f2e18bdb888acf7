-- reserve.lua: reserve stock for one purchase, atomically.
--
-- Keys, channels and record formats are gateway/layout.py's.
--
-- KEYS[1] stock    string: units not yet reserved
-- KEYS[2] buyers   hash:   user_id -> request_id of that user's reservation or order
-- KEYS[3] pending  hash:   request_id -> "user_id|qty|reserved_at_ms" (the ledger)
-- KEYS[4] done     hash:   request_id -> "order_id|user_id|qty" (confirmed orders)
-- ARGV[1] request_id, ARGV[2] user_id, ARGV[3] qty (>= 1), ARGV[4] now in ms
-- ARGV[5] retention in ms: a reservation keeps all four keys that long
--
-- Returns one of:
--   {"ok", stock_left}                     reserved; the ledger holds the request
--   {"confirmed", order_id, user_id, qty}  this request id already has an order
--   {"mismatch"}                           this request id has an order or a
--                                          reservation for another user or qty
--   {"in_progress"}                        this request id is still being processed
--   {"missing"}                            no stock key: reload it from PostgreSQL
--   {"duplicate"}                          this user already reserved or bought
--   {"sold_out", settled}                  too little stock; settled is 1 when
--                                          stock is 0 and nothing is pending
--
-- The request id is checked before the buyer, so replaying a confirmed request
-- returns its order rather than "duplicate", and the same id sent with another
-- payload (user, qty; the sku picks the keys) is refused rather than answered
-- with someone else's order; the buyer is checked before the
-- decrement, so repeat clicks never drain stock.
local rid, user, qty = ARGV[1], ARGV[2], tonumber(ARGV[3])

local order = redis.call("HGET", KEYS[4], rid)
if order then
  local order_id, buyer, bought = string.match(order, "^([^|]*)|([^|]*)|([^|]*)$")
  if buyer ~= user or tonumber(bought) ~= qty then
    return {"mismatch"}
  end
  return {"confirmed", order_id, buyer, bought}
end
local held = redis.call("HGET", KEYS[3], rid)
if held then
  local holder, held_qty = string.match(held, "^([^|]*)|([^|]*)|")
  if holder ~= user or tonumber(held_qty) ~= qty then
    return {"mismatch"}
  end
  return {"in_progress"}
end
local stock = redis.call("GET", KEYS[1])
if not stock then
  return {"missing"}
end
if redis.call("HEXISTS", KEYS[2], user) == 1 then
  return {"duplicate"}
end
stock = tonumber(stock)
if stock < qty then
  local settled = 0
  if stock <= 0 and redis.call("HLEN", KEYS[3]) == 0 then
    settled = 1
  end
  return {"sold_out", settled}
end
redis.call("DECRBY", KEYS[1], qty)
redis.call("HSET", KEYS[2], user, rid)
redis.call("HSET", KEYS[3], rid, user .. "|" .. qty .. "|" .. ARGV[4])
for i = 1, 4 do
  redis.call("PEXPIRE", KEYS[i], ARGV[5])
end
return {"ok", stock - qty}
