-- load_stock.lua: set a sku's Redis stock from the database's.
--
-- Keys, channels and record formats are gateway/redis/layout.py's.
--
-- KEYS[1] stock, KEYS[2] buyers, KEYS[3] pending, KEYS[4] done (as in reserve.lua)
-- KEYS[5] rebuild (as in reserve.lua)
-- ARGV[1] mode: "reload" sets stock only when the key is missing (Redis lost
--         it, or it expired); "reset" always sets it (an admin changed the
--         database stock); "fresh" is a reset whose caller knows the buyers
--         and done hashes are whole (a sku created now has no orders);
--         "repair" is a reset after the counter disagreed with the database
--         (the reconciler's drift): Redis lost writes, the hashes may miss
--         orders too, so the sku is flagged as rebuilding as after a reload
-- ARGV[2] database stock, ARGV[3] pub/sub channel, ARGV[4] sku
-- ARGV[5] retention in ms: the sku's keys are kept that long after a change
--
-- Stock becomes database stock minus what the ledger still holds, since those
-- reservations will take their units from the database when they flush.
-- "reload" never overwrites an existing counter: doing so while orders are in
-- flight over-admits. Publishes "meta:<sku>" after a reset and "avail:<sku>"
-- after a reload that found stock, so every gateway drops its sold-out mark.
-- A missing counter means Redis lost or expired the sale, and with it the
-- buyers and done hashes, or some of them: setting it also flags the sku as
-- rebuilding, with a lease nobody holds ("|0"), in the same step, so no
-- reservation ever trusts the incomplete hashes (lua/rebuild.lua takes it).
-- A "repair" flags it only when no rebuild is under way: the hashes are still
-- there, and the running rebuild writes every order into them all the same.
-- Returns {changed (0 or 1), stock, rebuilding (1 when this call flagged it)}.
local missing = redis.call("EXISTS", KEYS[1]) == 0
if ARGV[1] == "reload" and not missing then
  return {0, tonumber(redis.call("GET", KEYS[1])), 0}
end
local pending = 0
for _, entry in ipairs(redis.call("HVALS", KEYS[3])) do
  pending = pending + tonumber(string.match(entry, "^[^|]*|([^|]*)|"))
end
local stock = math.max(tonumber(ARGV[2]) - pending, 0)
redis.call("SET", KEYS[1], stock)
for i = 1, 4 do
  redis.call("PEXPIRE", KEYS[i], ARGV[5])
end
-- A rebuild already under way wrote its pages into hashes that are gone now:
-- its lease is taken from it, and the next holder starts over.
local flagged = 0
if missing and ARGV[1] ~= "fresh" then
  redis.call("SET", KEYS[5], "|0", "PX", ARGV[5])
  flagged = 1
elseif ARGV[1] == "repair" and redis.call("SET", KEYS[5], "|0", "PX", ARGV[5], "NX") then
  flagged = 1
end
if ARGV[1] ~= "reload" then
  redis.call("PUBLISH", ARGV[3], "meta:" .. ARGV[4])
elseif stock > 0 then
  redis.call("PUBLISH", ARGV[3], "avail:" .. ARGV[4])
end
return {1, stock, flagged}
