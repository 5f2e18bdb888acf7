-- release.lua: release one hold; the last one deletes the lock and wakes a waiter.
--
-- KEYS[1]  the lock hash {owner, count, fence}
-- KEYS[2]  the unlock channel (not a key, passed here so it travels with the hash tag)
-- ARGV[1]  owner id of the caller
-- ARGV[2]  lease in milliseconds, reset while holds remain
--
-- Returns -1  ARGV[1] does not own the lock (gone, or someone else's): nothing changes;
--          0  that was the last hold: the lock is deleted and 'unlock' is published;
--          n  n >= 1 holds remain, and the lease is reset.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return -1
end
local count = redis.call('HINCRBY', KEYS[1], 'count', -1)
if count > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return count
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[2], 'unlock')
return 0
