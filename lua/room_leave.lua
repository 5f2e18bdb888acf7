-- room_leave.lua: end a buyer's turn in a sku's waiting room once the order
-- the turn bought closed (cancelled, expired), so they may join the line
-- again at once, at its back.
--
-- Keys and records are gateway/redis/layout.py's (RoomKeys).
--
-- KEYS[1] users  hash:   user_id -> ticket
-- KEYS[2] used   string: the request id that spent the ticket's token
-- ARGV[1] user_id, ARGV[2] the user's ticket, ARGV[3] the closed order's request id
--
-- Returns 1 when the turn ended, else 0. Only a turn spent on that order
-- ends: a user who joined again meanwhile keeps their new place. The ticket
-- stays admitted and its token spent on the request, so a replay of the
-- purchase still gets its outcome.
if redis.call("HGET", KEYS[1], ARGV[1]) == ARGV[2] and redis.call("GET", KEYS[2]) == ARGV[3] then
  return redis.call("HDEL", KEYS[1], ARGV[1])
end
return 0
