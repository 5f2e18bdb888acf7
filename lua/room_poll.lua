-- room_poll.lua: let the next people in (at most admit_per_s a second, by
-- Redis's clock), then say where one ticket stands.
--
-- Keys and records are gateway/redis/layout.py's (RoomKeys, SkuKeys).
--
-- KEYS[1] wait     zset:   ticket -> join sequence
-- KEYS[2] tickets  hash:   ticket -> "user_id" or "user_id|admitted_ms"
-- KEYS[3] recent   zset:   ticket -> admitted_ms, admissions of the last second
-- KEYS[4] stock    string: the sku's units not yet reserved (read only)
-- KEYS[5] pending  hash:   the sku's reservation ledger (read only)
-- KEYS[6] early    string: the last join sequence given out before the start
-- KEYS[7] shuffled string: set once the early arrivals were shuffled
-- ARGV[1] ticket, ARGV[2] admit_per_s (>= 1)
-- ARGV[3] retention in ms: the room's keys live that long after an admission
-- ARGV[4] the sale's start in ms since the epoch, 0 when it has no start
-- ARGV[5] "1" to shuffle the early arrivals at the start, else "0"
-- ARGV[6] a random salt, the shuffle's only source of chance
-- ARGV[7] "1" while units are held for orders pending payment, else "0": the
--         line is kept, and let in only while there is stock (a unit that
--         comes back lets the next people in)
--
-- Returns one of:
--   {"unknown"}                                       no such ticket
--   {"sold_out"}                                      stock is 0, nothing pending
--                                                     or held
--   {"admitted", user_id, admitted_ms, admitted_now, waiting}  the ticket is through
--   {"waiting", user_id, position, admitted_now, waiting}      position 1 is the head
-- admitted_now is how many people this call let in and waiting how many are
-- left in the line (for the metrics).
--
-- Admission is a sliding window over Redis TIME: a ticket goes through only
-- while fewer than admit_per_s were admitted in the last 1000 ms, so no second
-- of any instance's clock sees more, however many gateways poll. People are let
-- in lazily, by whichever poll comes first: nobody polling means nobody waits.
-- Nobody is let in before the start. With the shuffle, the first poll at or
-- after it (SET NX on KEYS[7]: once) deals the early arrivals' join sequences
-- out again in the order of sha1(salt .. ticket): a random order among them,
-- still ahead of everyone who came after the start. O(n log n) in one script:
-- sized for tens of thousands of early arrivals.
local record = redis.call("HGET", KEYS[2], ARGV[1])
if not record then
  return {"unknown"}
end
local stock = redis.call("GET", KEYS[4])
local held = ARGV[7] == "1"
if stock and tonumber(stock) <= 0 and redis.call("HLEN", KEYS[5]) == 0 and not held then
  return {"sold_out"}
end

local time = redis.call("TIME")
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local starts = tonumber(ARGV[4])
local room = 0
if now >= starts then
  if ARGV[5] == "1" and starts > 0 and redis.call("SET", KEYS[7], "1", "NX", "PX", ARGV[3]) then
    local early = redis.call("GET", KEYS[6])
    if early then
      local line = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", early, "WITHSCORES")
      local tickets, scores, dealt = {}, {}, {}
      for i = 1, #line, 2 do
        tickets[#tickets + 1] = line[i]
        scores[#scores + 1] = line[i + 1]
        dealt[line[i]] = redis.sha1hex(ARGV[6] .. line[i])
      end
      table.sort(tickets, function(a, b) return dealt[a] < dealt[b] end)
      for i, ticket in ipairs(tickets) do
        redis.call("ZADD", KEYS[1], scores[i], ticket)
      end
    end
  end
  redis.call("ZREMRANGEBYSCORE", KEYS[3], "-inf", now - 1000)
  room = tonumber(ARGV[2]) - redis.call("ZCARD", KEYS[3])
  if held and stock and tonumber(stock) <= 0 then
    room = 0
  end
end
local admitted_now = 0
if room > 0 then
  local head = redis.call("ZPOPMIN", KEYS[1], room)
  for i = 1, #head, 2 do
    local ticket = head[i]
    local user = redis.call("HGET", KEYS[2], ticket)
    redis.call("HSET", KEYS[2], ticket, user .. "|" .. now)
    redis.call("ZADD", KEYS[3], now, ticket)
    admitted_now = admitted_now + 1
  end
  if admitted_now > 0 then
    for i = 1, 3 do
      redis.call("PEXPIRE", KEYS[i], ARGV[3])
    end
    record = redis.call("HGET", KEYS[2], ARGV[1])
  end
end

local waiting = redis.call("ZCARD", KEYS[1])
local bar = string.find(record, "|", 1, true)
if bar then
  local user, at = string.sub(record, 1, bar - 1), string.sub(record, bar + 1)
  return {"admitted", user, at, admitted_now, waiting}
end
local rank = redis.call("ZRANK", KEYS[1], ARGV[1])
return {"waiting", record, rank + 1, admitted_now, waiting}
