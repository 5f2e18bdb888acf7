-- enqueue.lua: reserve stock for one purchase and queue it for the writers, atomically.
--
-- gateway/scripts.py (read_composed) runs this file after reserve.lua, wrapped
-- as the local function reserve(): one script, so a purchase is reserved if
-- and only if it is queued, and reserve.lua's checks live in one place.
-- Keys and record formats are gateway/layout.py's.
--
-- KEYS[1..4] stock, buyers, pending, done: as in reserve.lua
-- KEYS[5] stream   the sku's queue; entry fields rid, user, qty, at
-- KEYS[6] rejected hash: request_id -> verdict of a queued purchase refused
-- ARGV[1..5] as in reserve.lua: request_id, user_id, qty, now in ms, retention in ms
-- ARGV[6] the most entries the stream may hold
--
-- Returns:
--   {"ok", stock_left, entry_id}  reserved, in the ledger and in the stream; an
--                                 earlier refusal of this request id is forgotten
--   {"busy"}                      the stream is full: nothing reserved or queued
--   any other reply of reserve.lua, unchanged: nothing reserved or queued
--
-- The bound is checked first, so a full stream costs no reservation to undo.
if redis.call("XLEN", KEYS[5]) >= tonumber(ARGV[6]) then
  return {"busy"}
end
local reply = reserve()
if reply[1] == "ok" then
  reply[3] = redis.call(
    "XADD", KEYS[5], "*", "rid", ARGV[1], "user", ARGV[2], "qty", ARGV[3], "at", ARGV[4]
  )
  redis.call("PEXPIRE", KEYS[5], ARGV[5])
  redis.call("HDEL", KEYS[6], ARGV[1])
end
return reply
