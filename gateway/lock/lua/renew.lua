-- renew.lua: extend the holder's lease, optionally adding a hold (re-entry).
--
-- KEYS[1]  the lock hash {owner, count, fence}
-- ARGV[1]  owner id of the caller
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  holds to add: 0 for a watchdog renewal, 1 for a re-entry
--
-- Returns the hold count after the call (>= 1) when ARGV[1] owns the lock, whose
--         lease is then reset to ARGV[2];
--         0 when the lock is gone or someone else's (nothing changes).
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
local count = redis.call('HINCRBY', KEYS[1], 'count', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return count
