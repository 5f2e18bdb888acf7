-- room_give_back.lua: give an admission token back after a purchase that failed
-- in a way the buyer may retry (503, 400), so the token can buy again.
--
-- KEYS[1] used  string: the request id that spent the token (RoomKeys.used)
-- ARGV[1] request_id that spent it
--
-- Returns 1 when given back, 0 when another request holds it (or none does).
-- Compared first, so a failed request never frees a token another one spent.
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
