-- An order's sku is kept from the inventory's side (issue 42). Idempotent:
-- every statement may run again on a database that has it.
--
-- The foreign key orders.sku -> inventory (001) checked each inserted order
-- against its sku's row, one query per row: 4 µs of PostgreSQL's CPU an order
-- of flush_batch's 28-32 (docs/performance.md, "The whole stack on one core"),
-- on the statement every durable order goes through. Every writer of orders
-- already reads that row first under a lock: flush_batch() locks it FOR UPDATE
-- and answers an unknown sku sold out without inserting, and a synchronous
-- strategy takes its stock with a guarded UPDATE of the row, then inserts
-- FROM inventory WHERE sku = ... (gateway/strategies/rows.py). So no order is
-- written for a sku that is not there, and what the key still promised is
-- that a sku with orders stays: these triggers keep that. A DELETE or a
-- rename of a sku that has orders, or a TRUNCATE of inventory while any order
-- exists, fails with foreign_key_violation (23503), as it did. The row's lock
-- (a flush's FOR UPDATE, a delete's) orders a flush and a delete of one sku,
-- so the check sees the flush's committed orders or the flush finds no row.
-- What only the key refused, and nothing here does: an order inserted by
-- hand, in SQL, for a sku that does not exist.
ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_sku_fkey;

CREATE OR REPLACE FUNCTION inventory_keeps_ordered_skus() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_LEVEL = 'STATEMENT' THEN
        IF EXISTS (SELECT 1 FROM orders) THEN
            RAISE foreign_key_violation USING
                MESSAGE = 'inventory cannot be truncated while orders exist',
                CONSTRAINT = 'orders_sku_fkey';
        END IF;
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.sku = OLD.sku THEN
        RETURN NEW;
    END IF;
    IF EXISTS (SELECT 1 FROM orders o WHERE o.sku = OLD.sku) THEN
        RAISE foreign_key_violation USING
            MESSAGE = format('sku %s has orders', OLD.sku),
            CONSTRAINT = 'orders_sku_fkey';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$$;

-- Only where a sku leaves: a stock change (UPDATE of other columns) runs nothing.
CREATE OR REPLACE TRIGGER inventory_keeps_ordered_skus BEFORE DELETE OR UPDATE OF sku
    ON inventory FOR EACH ROW EXECUTE FUNCTION inventory_keeps_ordered_skus();
CREATE OR REPLACE TRIGGER inventory_keeps_ordered_skus_truncate BEFORE TRUNCATE
    ON inventory FOR EACH STATEMENT EXECUTE FUNCTION inventory_keeps_ordered_skus();
