-- room_unspend.lua: unspend an admission token after a purchase that failed
-- in a way the buyer may retry (503, 400), so the token can buy again.
--
-- KEYS[1] used  string: the request id that spent the token (RoomKeys.used)
-- ARGV[1] request_id that spent it
--
-- Returns 1 when unspent, 0 when another request spent it (or none did).
-- Compared first, so a failed request never frees a token another one spent.
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
