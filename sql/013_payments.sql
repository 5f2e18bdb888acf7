-- One payment id, one payment (issue 38). Idempotent: every statement may run
-- again on a database that has it.
--
-- A payment id reaches the gateway in two places: as the payment of an order
-- (orders.payment_id) and as a late payment recorded for a refund
-- (late_payments). Each had its own unique check, so an id that paid order A
-- could be recorded as B's late payment, and a refund of it would have
-- returned A's real payment. Now every payment id the gateway ever took is a
-- row of `payments` naming the one order it is for, and its primary key is the
-- one constraint over both uses: a trigger on each writer claims the id in the
-- writer's own statement, whoever writes (this release, the one before it
-- during a rolling upgrade, or SQL by hand), and a claim of an id that is
-- another order's fails with unique_violation (23505), as the column's own
-- UNIQUE did before.
CREATE TABLE IF NOT EXISTS payments (
    payment_id   text PRIMARY KEY,
    -- The order (its request id) this payment is for, paid or refused late.
    request_id   text NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now()
);

-- Claim NEW.payment_id for NEW.request_id: a no-op when it is this order's
-- already (a payment sent again), unique_violation when another order's.
-- ON CONFLICT ... DO UPDATE waits for a concurrent claim of the same id and
-- then reads its committed row, so of two concurrent claims for two orders
-- exactly one passes.
CREATE OR REPLACE FUNCTION claim_payment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO payments (payment_id, request_id) VALUES (NEW.payment_id, NEW.request_id)
    ON CONFLICT (payment_id) DO UPDATE SET request_id = EXCLUDED.request_id
        WHERE payments.request_id = EXCLUDED.request_id;
    IF NOT FOUND THEN
        RAISE unique_violation USING
            MESSAGE = format('payment %s is for another order', NEW.payment_id),
            CONSTRAINT = 'payments_pkey';
    END IF;
    RETURN NULL;
END
$$;

-- The ids taken so far: a paid order's first (that payment is money kept),
-- then the late ones. A late payment recorded for an order other than the one
-- its id paid is what the bug above wrote: refunding it would return the
-- other order's payment, so it goes.
INSERT INTO payments (payment_id, request_id, received_at)
SELECT payment_id, request_id, COALESCE(closed_at, now()) FROM orders
WHERE payment_id IS NOT NULL
ON CONFLICT (payment_id) DO NOTHING;
DELETE FROM late_payments l USING payments p
WHERE p.payment_id = l.payment_id AND p.request_id <> l.request_id;
INSERT INTO payments (payment_id, request_id, received_at)
SELECT payment_id, request_id, received_at FROM late_payments
ON CONFLICT (payment_id) DO NOTHING;

-- The triggers fire only where an id is written: an order's payment (its
-- UPDATE of payment_id; orders are inserted without one, so an insert costs
-- one WHEN test) and a late payment's insert.
CREATE OR REPLACE TRIGGER orders_claim_payment_on_insert AFTER INSERT ON orders
    FOR EACH ROW WHEN (NEW.payment_id IS NOT NULL) EXECUTE FUNCTION claim_payment();
CREATE OR REPLACE TRIGGER orders_claim_payment AFTER UPDATE OF payment_id ON orders
    FOR EACH ROW WHEN (NEW.payment_id IS NOT NULL AND NEW.payment_id IS DISTINCT FROM OLD.payment_id)
    EXECUTE FUNCTION claim_payment();
CREATE OR REPLACE TRIGGER late_payments_claim_payment AFTER INSERT ON late_payments
    FOR EACH ROW EXECUTE FUNCTION claim_payment();

-- The column's own UNIQUE is now implied (one order per request id, one
-- request id per payment id) and cost an index entry on every order written.
DO $$
DECLARE
    v_name text;
BEGIN
    SELECT conname INTO v_name FROM pg_constraint
    WHERE conrelid = 'orders'::regclass AND contype = 'u'
        AND conkey = ARRAY[(SELECT attnum FROM pg_attribute
                            WHERE attrelid = 'orders'::regclass AND attname = 'payment_id')];
    IF v_name IS NOT NULL THEN
        EXECUTE format('ALTER TABLE orders DROP CONSTRAINT %I', v_name);
    END IF;
END
$$;
