-- reserve.lua: reserve stock for the purchases of one sku, atomically, in order.
--
-- Keys, channels and record formats are gateway/redis/layout.py's. One call carries
-- every reservation of the sku that arrived in one event-loop turn; each entry
-- is decided as if it had had a call of its own, after the entries before it.
--
-- KEYS[1] stock    string: units not yet reserved
-- KEYS[2] buyers   hash:   user_id -> request_id of that user's reservation or order
-- KEYS[3] pending  hash:   request_id -> "user_id|qty|reserved_at_ms" (the ledger)
-- KEYS[4] done     hash:   request_id -> "order_id|user_id|qty" (confirmed orders)
-- KEYS[5] call     string: this call's replies, once it reserved (JSON), kept
--                  30 s or the retention (ARGV[1]) if shorter
-- KEYS[6] rebuild  string: "owner|lease_until_ms" while the buyers and done hashes
--                  are being rebuilt from PostgreSQL (lua/rebuild.lua), so
--                  incomplete; absent otherwise
-- KEYS[7..] token buckets "tokens|at_ms" of the entries' users and clients
--           (<prefix>:{sku}:rl:u:<user>, <prefix>:{sku}:rl:c:<address>)
-- KEYS[ARGV[9]..] a sku in a limit group: the buyers, pending and done hashes of
--           each other sku of its group, three by three (the group's slot)
-- ARGV[1] retention in ms: a reservation keeps the four sku keys that long
-- ARGV[2] starts_at, ARGV[3] ends_at: the sale window in ms since the epoch,
--         "" for none; decided against this Redis's TIME, not the caller's clock
-- ARGV[4] user rate (tokens/s, 0 = off), ARGV[5] user burst
-- ARGV[6] client rate (tokens/s, 0 = off), ARGV[7] client burst
-- ARGV[8] the limit group's per_user_limit, 0 for a sku in no group
-- ARGV[9] the index in KEYS of the first of the group's other hashes (past
--         the last key when there are none)
-- ARGV[10..] six per entry: request_id, user_id, qty (>= 1), the index in
--           KEYS of the user's bucket and of the client's bucket (0: none),
--           verified (1: PostgreSQL holds no order of this request id or buyer,
--           checked by the caller after an "unverified" reply; else 0)
--
-- Returns one reply per entry, in order, each one of:
--   {"ok", stock_left, reserved_at_ms}     reserved (stamped with Redis TIME);
--                                          the ledger holds the request
--   {"confirmed", order_id, user_id, qty}  this request id already has an order
--   {"mismatch"}                           this request id has an order or a
--                                          reservation for another user or qty
--   {"in_progress"}                        this request id is still being processed
--   {"not_started", ms_to_start}           before the window
--   {"ended"}                              after the window
--   {"missing"}                            no stock key: reload it from PostgreSQL
--   {"unverified", orphaned, exhausted}    the hashes are being rebuilt and the
--                                          entry is not verified: neither a
--                                          replay nor a repeat buyer can be told
--                                          from a new purchase here; orphaned is
--                                          1 when the rebuild's lease ran out,
--                                          exhausted 1 when stock is 0 and nothing
--                                          is pending (only a replay can get
--                                          anything but sold out)
--   {"rate_limited", ms_to_a_token}        a bucket of the user or client is empty
--   {"duplicate"}                          this user already reserved or bought
--   {"group_limit"}                        the units this user holds across the
--                                          sku's limit group (a reservation or a
--                                          confirmed order in each sku's buyers
--                                          hash) and qty pass the group's limit
--   {"sold_out", exhausted}                too little stock; exhausted is 1 when
--                                          stock is 0 and nothing is pending
--
-- The request id is checked first, so a replay gets its outcome whatever the
-- window and the limits; the buyer is checked before the decrement, so repeat
-- clicks never drain stock; the limit group is checked after the buyer, before
-- the stock. A request turned away by the window or a missing
-- key takes no token, nor does an unverified one; any other attempt takes one
-- from each of its buckets,
-- all or none. Sold out beats rate limited: nobody is told to come back for
-- stock that is gone.
-- A call sent again (redis-py retries a command, or a whole cluster pipeline,
-- after a timeout or a failed node even when this call already ran) gets the
-- replies of its first run: run twice, its reservations would read as another
-- request's "in_progress" and be held until the reconciler released them.
local earlier = redis.call("GET", KEYS[5])
if earlier then
  return cjson.decode(earlier)
end

local time = redis.call("TIME")
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local starts, ends = tonumber(ARGV[2]), tonumber(ARGV[3])
-- While the hashes are rebuilt, an entry found in neither of them may still be a
-- replay or a repeat buyer: only one PostgreSQL cleared (verified) goes on.
local rebuild = redis.call("GET", KEYS[6])
local orphaned = 0
if rebuild and tonumber(string.match(rebuild, "|(%d+)$")) <= now then
  orphaned = 1
end
-- The stock is read once and taken once, after the last entry: the call is
-- atomic, so the entries see it exactly as with a GET and a DECRBY each (two
-- of an entry's seven commands, which Redis ran while the gateway waited).
-- A counter that is not a number raises at an entry's first comparison, as before.
local counter = redis.call("GET", KEYS[1])
local stock = counter and tonumber(counter)
local taken = 0
local group_limit, members_at = tonumber(ARGV[8]), tonumber(ARGV[9])
local rates = {tonumber(ARGV[4]), tonumber(ARGV[6])}
local bursts = {tonumber(ARGV[5]), tonumber(ARGV[7])}

local function refilled(key, rate, burst)
  local state = redis.call("GET", key)
  if not state then
    return burst
  end
  local tokens, at = string.match(state, "^([^|]*)|(.*)$")
  return math.min(burst, tonumber(tokens) + (now - tonumber(at)) * rate / 1000)
end

-- 0 when each bucket held a token (one is taken from each), else the ms until
-- the emptiest has one again.
local function take(bucket_keys)
  local tokens, wait = {}, 0
  for b = 1, 2 do
    if bucket_keys[b] then
      tokens[b] = refilled(bucket_keys[b], rates[b], bursts[b])
      if tokens[b] < 1 then
        wait = math.max(wait, math.ceil((1 - tokens[b]) * 1000 / rates[b]))
      end
    end
  end
  if wait > 0 then
    return wait
  end
  for b = 1, 2 do
    if bucket_keys[b] then
      local full_ms = math.ceil(bursts[b] * 1000 / rates[b]) + 1000
      redis.call("SET", bucket_keys[b], (tokens[b] - 1) .. "|" .. now, "PX", full_ms)
    end
  end
  return 0
end

-- The units a user holds in the group's other skus: the qty of the reservation
-- (ledger) or confirmed order (done) their buyers hash names, sku by sku. A sku
-- holds at most one of a user's (one order per buyer); this sku holds none,
-- since the user passed the buyers check.
local function group_held(user)
  local held = 0
  for k = members_at, #KEYS, 3 do
    local rid = redis.call("HGET", KEYS[k], user)
    if rid then
      local units
      local record = redis.call("HGET", KEYS[k + 1], rid)
      if record then
        units = string.match(record, "^[^|]*|([^|]*)|")
      else
        record = redis.call("HGET", KEYS[k + 2], rid)
        units = record and string.match(record, "^[^|]*|[^|]*|([^|]*)$")
      end
      held = held + (tonumber(units) or 0)
    end
  end
  return held
end

local function sold_out()
  if stock <= 0 and redis.call("HLEN", KEYS[3]) == 0 then
    return {"sold_out", 1}
  end
  return {"sold_out", 0}
end

local function replay(rid, user, qty)
  local order = redis.call("HGET", KEYS[4], rid)
  if order then
    local order_id, buyer, bought = string.match(order, "^([^|]*)|([^|]*)|([^|]*)$")
    if buyer ~= user or tonumber(bought) ~= qty then
      return {"mismatch"}
    end
    return {"confirmed", order_id, buyer, bought}
  end
  local held = redis.call("HGET", KEYS[3], rid)
  if held then
    local holder, held_qty = string.match(held, "^([^|]*)|([^|]*)|")
    if holder ~= user or tonumber(held_qty) ~= qty then
      return {"mismatch"}
    end
    return {"in_progress"}
  end
  return nil
end

local reserved = false

local function reserve(rid, user, qty, bucket_keys, verified)
  local answer = replay(rid, user, qty)
  if answer then
    return answer
  end
  if starts and now < starts then
    return {"not_started", starts - now}
  end
  if ends and now >= ends then
    return {"ended"}
  end
  if not counter then
    return {"missing"}
  end
  if rebuild and not verified then
    local exhausted = 0
    if stock <= 0 and redis.call("HLEN", KEYS[3]) == 0 then
      exhausted = 1
    end
    return {"unverified", orphaned, exhausted}
  end
  local wait = take(bucket_keys)
  if wait > 0 then
    if stock < qty then
      return sold_out()
    end
    return {"rate_limited", wait}
  end
  if redis.call("HEXISTS", KEYS[2], user) == 1 then
    return {"duplicate"}
  end
  if group_limit > 0 and group_held(user) + qty > group_limit then
    return {"group_limit"}
  end
  if stock < qty then
    return sold_out()
  end
  stock = stock - qty
  taken = taken + qty
  redis.call("HSET", KEYS[2], user, rid)
  redis.call("HSET", KEYS[3], rid, user .. "|" .. qty .. "|" .. now)
  reserved = true
  return {"ok", stock, now}
end

local replies = {}
for base = 10, #ARGV, 6 do
  local user_key, client_key = tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
  local bucket_keys = {KEYS[user_key], KEYS[client_key]}
  local verified = ARGV[base + 5] == "1"
  replies[#replies + 1] =
    reserve(ARGV[base], ARGV[base + 1], tonumber(ARGV[base + 2]), bucket_keys, verified)
end
if reserved then
  redis.call("DECRBY", KEYS[1], taken)
  for i = 1, 4 do
    redis.call("PEXPIRE", KEYS[i], ARGV[1])
  end
  -- Long enough for redis-py to send a timed-out call again; never past the
  -- sale's own keys, whose retention a test may make shorter.
  redis.call("SET", KEYS[5], cjson.encode(replies), "PX", math.min(30000, tonumber(ARGV[1])))
end
return replies
