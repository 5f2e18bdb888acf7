-- enqueue.lua: reserve stock for the purchases of one sku and queue the ones
-- reserved for the writers, atomically.
--
-- gateway/redis/scripts.py (read_composed) runs this file after reserve.lua, wrapped
-- as the local function reserve(): one script, so a purchase is reserved if
-- and only if it is queued, and reserve.lua's checks live in one place.
-- Keys and record formats are gateway/redis/layout.py's.
--
-- KEYS as in reserve.lua, then two more, last:
--   KEYS[#KEYS - 1] stream    the sku's queue; entry fields rid, user, qty, at
--   KEYS[#KEYS]     rejected  hash: request_id -> verdict of a queued purchase refused
-- ARGV as in reserve.lua, then one more, last: the most entries the stream may hold
--
-- Returns one reply per entry, in order, each one of:
--   {"ok", stock_left, reserved_at_ms, entry_id}  reserved, in the ledger and in
--                                 the stream; an earlier refusal of this request
--                                 id is forgotten
--   {"busy"}                      the stream is full: nothing reserved or queued
--   any other reply of reserve.lua, unchanged: nothing reserved or queued
--
-- The bound is checked first, so a full stream costs no reservation to undo.
-- The two extra keys and the bound are taken off KEYS and ARGV before
-- reserve() reads them, so reserve.lua sees exactly its own contract.
local bound = tonumber(table.remove(ARGV))
local rejected = table.remove(KEYS)
local stream = table.remove(KEYS)
local first, per_entry = 10, 6

if redis.call("XLEN", stream) >= bound then
  local busy = {}
  for _ = first, #ARGV, per_entry do
    busy[#busy + 1] = {"busy"}
  end
  return busy
end

-- A call sent again gets its first replies from reserve(): queue nothing twice.
local again = redis.call("EXISTS", KEYS[5]) == 1
local replies = reserve()
if again then
  return replies
end
local queued = false
for i, reply in ipairs(replies) do
  if reply[1] == "ok" then
    local at = first + (i - 1) * per_entry
    reply[4] = redis.call(
      "XADD", stream, "*", "rid", ARGV[at], "user", ARGV[at + 1], "qty", ARGV[at + 2],
      "at", reply[3]
    )
    redis.call("HDEL", rejected, ARGV[at])
    queued = true
  end
end
if queued then
  redis.call("PEXPIRE", stream, ARGV[1])
end
return replies
