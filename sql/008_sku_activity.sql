-- Which skus are active, and which are archived (issue 33).
-- Idempotent: every statement may run again on a database that has it.
--
-- idle_at: the updated_at the reconciler last found the sku exhausted at,
-- with nothing pending or held. Every change of the row sets updated_at =
-- now() (a flush, a restock, an admin change, an archive), so the sku is
-- active again as soon as anything changes it: active is
-- `idle_at IS DISTINCT FROM updated_at` (gateway.postgres.inventory.ACTIVE).
-- No index on it: an index whose predicate reads updated_at would end the
-- flushes' HOT updates of the row.
-- archived_at: when DELETE /admin/skus/{sku} retired the sku; its orders,
-- movements and audit stay, purchases of it are 404 unknown_sku.
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS idle_at timestamptz;
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS archived_at timestamptz;
