"""The PostgreSQL adapter's SQL (gateway.postgres.orders): every statement as a named constant.

The flush itself is the ``flush_batch`` function of ``sql/functions/flush_batch.sql``,
so a flush costs one round trip. Every statement that takes stock carries its
``stock >=`` guard (``tests/unit/test_sql_guard.py`` scans for it), so the database
refuses an oversell whatever Redis or a lock said.
"""

from __future__ import annotations

# Serializes writers of one sku (admin changes lock the row too).
LOCK_INVENTORY_ROW = "SELECT stock, fence FROM inventory WHERE sku = $1 FOR UPDATE"
# A whole flush in one round trip: see sql/functions/flush_batch.sql, whose UPDATE
# carries the stock >= guard and the fencing check.
FLUSH_BATCH = """
SELECT * FROM flush_batch($1, $2::text[], $3::text[], $4::int[], $5::bigint[], $6::bigint)
"""
# The reconciler's side of the same arbitration: under the row lock, stale
# reservations without an order are recorded as released, so a flush still on
# its way answers them "X" instead of committing them after their stock went back.
RECORD_RELEASED = """
INSERT INTO released_reservations (request_id, reserved_at_ms)
SELECT * FROM unnest($1::text[], $2::bigint[]) ON CONFLICT DO NOTHING
"""
# Which database this is: the cluster's system identifier, the database's oid
# and the WAL timeline (the first 8 hex digits of the current WAL file's name).
# A database restored from a dump into a new database, or another cluster,
# differs in the first two; a standby promoted by a failover, or a point-in-time
# recovery, shares them with its origin but starts a new timeline.
DATABASE_IDENTITY = """
SELECT (SELECT system_identifier FROM pg_control_system())::text || ':'
    || (SELECT oid FROM pg_database WHERE datname = current_database())::text || ':'
    || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)
"""
# Where pg_control_system() is not granted (some managed services): the oid alone.
DATABASE_OID = """
SELECT '?:' || (SELECT oid FROM pg_database WHERE datname = current_database())::text
"""
SKU_INFO = """
SELECT stock, per_user_limit, room_admit_per_s, room_token_ttl_s, room_shuffle_at_start,
       starts_at, ends_at, user_rate, client_rate, strategy
FROM inventory WHERE sku = $1
"""
# The same, with the row locked for an admin change (admin changes and flushes
# of the sku queue on it).
LOCK_SKU_SETTINGS = SKU_INFO.rstrip() + " FOR UPDATE\n"
SKU_STOCK = "SELECT stock FROM inventory WHERE sku = $1"
ALL_SKUS = "SELECT sku FROM inventory ORDER BY sku"
# Skus sold through a waiting room (gateway.usecases.servable: they need an admission secret).
WAITING_ROOM_SKUS = """
SELECT sku FROM inventory WHERE room_admit_per_s IS NOT NULL ORDER BY sku LIMIT $1
"""
ORDERS_BY_REQUESTS = """
SELECT order_id::text, request_id, sku, user_id, qty FROM orders
WHERE request_id = ANY($1::text[])
"""
# While a sku's Redis hashes are rebuilt: the order of a request id, and the
# buyer's order of the sku (two unique indexes; at most two rows).
PRIOR_ORDERS = """
SELECT order_id::text, request_id, sku, user_id, qty FROM orders
WHERE request_id = $1 OR (sku = $2 AND user_id = $3)
"""
# One page of a sku's orders for a rebuild, in the (sku, user_id) unique index's
# order after the last buyer of the page before, as one text: per order its
# request id, the done-hash record of gateway.redis.layout.encode_confirmed and its
# buyer, every field followed by a tab (ids never hold one, gateway.http.payloads);
# then the page's last buyer and its count of orders. One value to decode
# instead of a row per order: the gateway's work per page is one split.
ORDER_PAGE = """
SELECT string_agg(
    request_id || E'\\t' || order_id::text || '|' || user_id || '|' || qty::text || E'\\t'
    || user_id || E'\\t', '' ORDER BY user_id), max(user_id), count(*)
FROM (SELECT request_id, order_id, user_id, qty FROM orders
      WHERE sku = $1 AND user_id > $2 ORDER BY user_id LIMIT $3) AS page
"""
UNITS_SOLD = "SELECT COALESCE(SUM(qty), 0) FROM orders WHERE sku = $1"
# A new sku starts empty, so two concurrent creations both see the row (and
# wait for its lock) and each records only its own difference.
CREATE_SKU = """
INSERT INTO inventory (sku, stock) VALUES ($1, 0) ON CONFLICT (sku) DO NOTHING RETURNING sku
"""
SET_SKU = """
UPDATE inventory SET stock = $2, per_user_limit = $3, strategy = $4, updated_at = now()
WHERE sku = $1
"""
SET_SALE_RULES = """
UPDATE inventory SET starts_at = $2, ends_at = $3, user_rate = $4, client_rate = $5 WHERE sku = $1
"""
RESTOCK = """
UPDATE inventory SET stock = stock + $2, updated_at = now() WHERE sku = $1 RETURNING stock
"""
# A PUT replaces the whole sku, so no waiting room in it means none any more.
SET_WAITING_ROOM = """
UPDATE inventory
SET room_admit_per_s = $2, room_token_ttl_s = $3, room_shuffle_at_start = $4
WHERE sku = $1
"""
RECORD_MOVEMENT = """
INSERT INTO stock_movements (sku, delta, reason, stock_after) VALUES ($1, $2, $3, $4)
"""
# The window and rate limits of a strategy that decides in PostgreSQL alone, in
# one round trip: see sql/functions/sale_gate.sql.
SALE_GATE = "SELECT verdict, wait_ms FROM sale_gate($1, $2, $3, $4, $5, $6, $7, $8, $9)"
# Buckets past their expiry are full again: the same as no row.
PRUNE_RATE_BUCKETS = "DELETE FROM rate_buckets WHERE expires_at < now()"
