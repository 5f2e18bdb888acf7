-- A sale window's instants stay where every layer can hold them (issue 38):
-- years 2000 to 9999 in UTC. The admin API refuses anything else at the door
-- (gateway.domain.rules.parse_instant); this is the floor under it. Before,
-- a starts_at of year 1 passed PostgreSQL and then broke Python's datetime on
-- every later read of the sku, and one whose offset took it before year 1 was
-- stored BC, which asyncpg cannot read back.
-- Idempotent: every statement may run again on a database that has it.

-- A window already stored out of range keeps its meaning: a start long ago
-- is no start, an end long ago an end at the range's first instant, an end
-- beyond it no end, a start beyond it a start at its last.
UPDATE inventory SET starts_at = NULL WHERE starts_at < '2000-01-01T00:00:00Z';
UPDATE inventory SET ends_at = '2000-01-01T00:00:00Z' WHERE ends_at < '2000-01-01T00:00:00Z';
UPDATE inventory SET ends_at = NULL WHERE ends_at > '9999-12-31T23:59:59.999999Z';
UPDATE inventory SET starts_at = '9999-12-31T23:59:59.999999Z'
WHERE starts_at > '9999-12-31T23:59:59.999999Z';

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'inventory_window_range') THEN
        ALTER TABLE inventory ADD CONSTRAINT inventory_window_range CHECK (
            starts_at BETWEEN '2000-01-01T00:00:00Z' AND '9999-12-31T23:59:59.999999Z'
            AND ends_at BETWEEN '2000-01-01T00:00:00Z' AND '9999-12-31T23:59:59.999999Z'
        );
    END IF;
END
$$;
