-- acquire.lua: take a free lock and give the new holder a fencing token.
--
-- KEYS[1]  the lock: a hash {owner, count, fence} that expires with the lease
-- KEYS[2]  the fence counter; same hash tag as KEYS[1]
-- ARGV[1]  owner id: "pid:random" of the lock object ":" task serial (new for each task)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  the fence counter's lifetime after the last acquisition, in milliseconds
--
-- Returns {1, fence}  the lock was free and is now ARGV[1]'s, hold count 1;
--         {0, pttl}   it is held (possibly by a stale hold of ARGV[1] itself, which
--                     must run out): pttl is its remaining TTL in ms (-1: no expiry),
--                     the longest a waiter needs to sleep before trying again.
--
-- The fence is INCR on KEYS[2], raised to Redis's clock in microseconds when that is
-- higher: tokens strictly increase across holders, and keep increasing after a
-- restart or failover that lost the counter (a counter starting again at 1 would
-- fence out every new holder and let a stale one win). For the same reason the
-- counter may expire: after ARGV[3] without an acquisition the clock is past every
-- token it gave out, and a lock nobody takes any more leaves no key behind.
-- Re-entry by the holding task goes through lock_renew.lua, never through here.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('PTTL', KEYS[1])}
end
local fence = redis.call('INCR', KEYS[2])
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
if now_us > fence then
  fence = now_us
  redis.call('SET', KEYS[2], string.format('%.0f', now_us))
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'count', 1, 'fence', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, fence}
