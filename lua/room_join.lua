-- room_join.lua: put a user in a sku's waiting room, or find their ticket.
--
-- Keys and records are gateway/redis/layout.py's (RoomKeys, SkuKeys).
--
-- KEYS[1] wait     zset:   ticket -> join sequence
-- KEYS[2] users    hash:   user_id -> ticket
-- KEYS[3] tickets  hash:   ticket -> "user_id" or "user_id|admitted_ms"
-- KEYS[4] seq      string: last join sequence
-- KEYS[5] stock    string: the sku's units not yet reserved (read only)
-- KEYS[6] pending  hash:   the sku's reservation ledger (read only)
-- KEYS[7] early    string: the last join sequence given out before the start
-- KEYS[8] bot      string: the spent-token key of the join's bot token
--                  (RoomKeys.bot; untouched unless ARGV[8] is "1")
-- ARGV[1] user_id, ARGV[2] a fresh ticket, used only if the user has none
-- ARGV[3] retention in ms: the room's keys live that long after a join
-- ARGV[4] the sale's start in ms since the epoch, 0 when it has no start
-- ARGV[5] the room's admission token lifetime in ms
-- ARGV[6] "1" while units are held for orders pending payment (they may come
--         back on sale), else "0"
-- ARGV[7] "1" when the room checks for bots: a new ticket needs ARGV[8]
-- ARGV[8] "1" when the join's bot token passed its provider's check, else "0"
-- ARGV[9] how long a bot token that made a ticket is kept, in ms
--
-- Returns one of:
--   {"sold_out"}                          stock is 0, nothing is pending and
--                                         nothing held
--   {"bot_check"}                         a new ticket is needed and the join
--                                         brought no bot token that passed
--   {"reused"}                            its bot token already made a ticket
--   {"joined", ticket, position, waiting} position 1 is the head; 0 when the
--                                         ticket was already admitted
--
-- Sold out is decided here, with the join, so nobody joins the line for a sku that
-- is already gone; a missing stock key is not sold out (it is reloaded on the
-- next purchase). A user whose admission expired (its token's lifetime passed,
-- by Redis's clock) joins again at the back of the line with the fresh ticket:
-- the old ticket stays admitted, its token expired, so a purchase made with it
-- in time still gets its outcome.
--
-- In a room that checks for bots, a ticket made after a check passed begins
-- with "h" (gateway.usecases.admission_tokens.CHECKED; hex tickets never do).
-- A buyer who holds one joins again without a bot token. One who holds a ticket
-- made before the room checked needs a bot token: the checked ticket replaces
-- the old one in its place while it still waits. The bot token is claimed
-- (SET NX) with the ticket it makes, atomically: one token, one ticket.
local stock = redis.call("GET", KEYS[5])
if stock and tonumber(stock) <= 0 and redis.call("HLEN", KEYS[6]) == 0 and ARGV[6] ~= "1" then
  return {"sold_out"}
end

local user, retention = ARGV[1], ARGV[3]
local time = redis.call("TIME")
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local ticket = redis.call("HGET", KEYS[2], user)
if ticket then
  local admitted = string.match(redis.call("HGET", KEYS[3], ticket) or "", "|(%d+)$")
  if admitted and now >= tonumber(admitted) + tonumber(ARGV[5]) then
    ticket = nil
  end
end
local checking, stale = ARGV[7] == "1", nil
if ticket and checking and string.sub(ticket, 1, 1) ~= "h" then
  stale, ticket = ticket, nil
end
if not ticket then
  if checking then
    if ARGV[8] ~= "1" then
      return {"bot_check"}
    end
    if not redis.call("SET", KEYS[8], "1", "NX", "PX", ARGV[9]) then
      return {"reused"}
    end
  end
  ticket = ARGV[2]
  local seq = stale and redis.call("ZSCORE", KEYS[1], stale)
  if seq then
    redis.call("ZREM", KEYS[1], stale)
    redis.call("HDEL", KEYS[3], stale)
  else
    seq = redis.call("INCR", KEYS[4])
    -- Early arrivals are told apart by Redis's clock, not the gateway's.
    if now < tonumber(ARGV[4]) then
      redis.call("SET", KEYS[7], seq, "PX", retention)
    end
  end
  redis.call("ZADD", KEYS[1], seq, ticket)
  redis.call("HSET", KEYS[2], user, ticket)
  redis.call("HSET", KEYS[3], ticket, user)
  for i = 1, 4 do
    redis.call("PEXPIRE", KEYS[i], retention)
  end
end

local rank = redis.call("ZRANK", KEYS[1], ticket)
local position = rank and rank + 1 or 0
return {"joined", ticket, position, redis.call("ZCARD", KEYS[1])}
