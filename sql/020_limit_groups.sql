-- Limit groups (issue 41): one buyer limit across a group of skus (a drop in
-- ten sizes, "one pair per customer"), with PostgreSQL as its floor.
-- Idempotent: every statement may run again on a database that has it.

-- A limit group: the most units one buyer may hold across its skus.
CREATE TABLE IF NOT EXISTS limit_groups (
    limit_group     text PRIMARY KEY,
    per_user_limit  integer NOT NULL CHECK (per_user_limit BETWEEN 1 AND 1000),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- The group a sku belongs to, if any. A group named by a sku cannot be
-- deleted (409 group_in_use): the foreign key says so too.
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS limit_group text
    REFERENCES limit_groups (limit_group);
CREATE INDEX IF NOT EXISTS inventory_limit_group ON inventory (limit_group)
    WHERE limit_group IS NOT NULL;

-- A buyer's holding in a group: the units of their live orders (confirmed,
-- pending_payment, paid) of the group's skus. Written only by the triggers
-- below, in the statement that inserts or closes the order, so it is exactly
-- the sum of those orders; flush_batch() and the synchronous strategies read
-- a buyer's row to decide (gateway.strategies.rows), and the insert trigger
-- refuses an order that takes a buyer past the group's limit (FS003), whatever
-- Redis said. A sku joins or leaves a group only while it has no live order
-- (gateway.postgres.inventory), so the sum never needs moving.
CREATE TABLE IF NOT EXISTS group_holdings (
    limit_group  text NOT NULL,
    user_id      text NOT NULL,
    units        integer NOT NULL CHECK (units >= 0),
    PRIMARY KEY (limit_group, user_id)
);

-- Orders inserted live add their units to their buyer's holding in their
-- sku's group; past the group's limit the statement fails (FS003), so the
-- order and the stock it took roll back. One statement per INSERT statement
-- (a flush's batch is one), in (group, buyer) order: flushes of two skus of
-- one group lock their buyers' rows in the same order.
CREATE OR REPLACE FUNCTION orders_group_held() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_over text;
BEGIN
    WITH added AS (
        INSERT INTO group_holdings AS h (limit_group, user_id, units)
        SELECT inv.limit_group, n.user_id, sum(n.qty)
        FROM inserted n JOIN inventory inv ON inv.sku = n.sku
        WHERE inv.limit_group IS NOT NULL
            AND n.status IN ('confirmed', 'pending_payment', 'paid')
        GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (limit_group, user_id) DO UPDATE SET units = h.units + excluded.units
        RETURNING h.limit_group, h.units
    )
    SELECT a.limit_group INTO v_over FROM added a
    JOIN limit_groups g ON g.limit_group = a.limit_group
    WHERE a.units > g.per_user_limit LIMIT 1;
    IF v_over IS NOT NULL THEN
        RAISE EXCEPTION 'group limit: a buyer would hold more than the limit of %', v_over
            USING ERRCODE = 'FS003', DETAIL = v_over;
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS orders_group_held ON orders;
CREATE TRIGGER orders_group_held AFTER INSERT ON orders
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION orders_group_held();

-- Orders that stop being live (expired, cancelled, refunded: the statement
-- that closes them, which returns their stock) or are deleted give their
-- units back to the holding, exactly once: an order leaves the live statuses
-- once. Buyer by buyer in (group, buyer) order, as the insert trigger locks them.
CREATE OR REPLACE FUNCTION orders_group_closed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    rec record;
BEGIN
    FOR rec IN
        SELECT inv.limit_group AS g, n.user_id AS u, sum(n.qty) AS units
        FROM after_rows n JOIN before_rows o USING (order_id)
        JOIN inventory inv ON inv.sku = n.sku
        WHERE inv.limit_group IS NOT NULL
            AND o.status IN ('confirmed', 'pending_payment', 'paid')
            AND n.status NOT IN ('confirmed', 'pending_payment', 'paid')
        GROUP BY 1, 2 ORDER BY 1, 2
    LOOP
        UPDATE group_holdings SET units = greatest(units - rec.units, 0)
        WHERE limit_group = rec.g AND user_id = rec.u;
    END LOOP;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS orders_group_closed ON orders;
CREATE TRIGGER orders_group_closed AFTER UPDATE ON orders
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION orders_group_closed();

CREATE OR REPLACE FUNCTION orders_group_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    rec record;
BEGIN
    FOR rec IN
        SELECT inv.limit_group AS g, o.user_id AS u, sum(o.qty) AS units
        FROM before_rows o JOIN inventory inv ON inv.sku = o.sku
        WHERE inv.limit_group IS NOT NULL
            AND o.status IN ('confirmed', 'pending_payment', 'paid')
        GROUP BY 1, 2 ORDER BY 1, 2
    LOOP
        UPDATE group_holdings SET units = greatest(units - rec.units, 0)
        WHERE limit_group = rec.g AND user_id = rec.u;
    END LOOP;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS orders_group_deleted ON orders;
CREATE TRIGGER orders_group_deleted AFTER DELETE ON orders
    REFERENCING OLD TABLE AS before_rows
    FOR EACH STATEMENT EXECUTE FUNCTION orders_group_deleted();
