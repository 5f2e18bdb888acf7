-- The shop's side of an order (issue 40): refunds of paid orders and of late
-- payments, a buyer's orders, and events that say who changed an order and why.
-- Idempotent: every statement may run again on a database that has it.

-- refunded: a paid (or confirmed) order whose payment went back to the buyer.
-- Not live: its buyer may buy the sku again.
ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check CHECK (status IN
    ('confirmed', 'pending_payment', 'paid', 'cancelled', 'expired', 'refunded'));

-- Who made an order's last change, and the caller's words for it: the event
-- of the change carries both (copied by the triggers below).
--   buyer: the purchase, or a cancel; payment: a pay or a refund;
--   sweep: an expiry; admin: a cancel or a refund with the admin token.
ALTER TABLE orders ADD COLUMN IF NOT EXISTS cause text
    CHECK (cause IN ('buyer', 'payment', 'sweep', 'admin'));
ALTER TABLE orders ADD COLUMN IF NOT EXISTS reason text;
-- A refunded order's units: back on sale (true), or kept by the buyer (false).
-- NULL for every other status. A refund without restock returns no unit, so
-- what a return owes Redis is ORDER_UNITS, not qty.
ALTER TABLE orders ADD COLUMN IF NOT EXISTS restocked boolean;

-- Returns owed to Redis, refunds included (the queries name the three
-- statuses, so that they imply this predicate).
CREATE INDEX IF NOT EXISTS orders_owed ON orders (sku)
    WHERE status IN ('expired', 'cancelled', 'refunded') AND synced_at IS NULL;
DROP INDEX IF EXISTS orders_unsynced;

-- A buyer's orders, newest first (GET /v1/orders?user_id=). It takes the
-- place of orders_buyer, which only the flush_batch of the release before
-- 007 needed: every statement since looks a buyer up among live orders
-- (orders_live_buyer). One index entry per order either way.
CREATE INDEX IF NOT EXISTS orders_user ON orders (user_id, created_at DESC, order_id);
DROP INDEX IF EXISTS orders_buyer;

-- A payment of a refunded order (other than the one refunded with it) comes
-- late too.
ALTER TABLE late_payments DROP CONSTRAINT IF EXISTS late_payments_reason_check;
ALTER TABLE late_payments ADD CONSTRAINT late_payments_reason_check
    CHECK (reason IN ('expired', 'cancelled', 'refunded'));

-- A late payment is owed to the buyer until refunded; seq is the order of
-- recording, the list's cursor (oldest first).
ALTER TABLE late_payments ADD COLUMN IF NOT EXISTS refunded_at timestamptz;
ALTER TABLE late_payments ADD COLUMN IF NOT EXISTS seq bigint GENERATED ALWAYS AS IDENTITY;
CREATE UNIQUE INDEX IF NOT EXISTS late_payments_seq ON late_payments (seq);

-- What an event carries beyond the order's own fields, each NULL where it
-- does not apply: the payment (paid, refunded, a late payment's events), the
-- deadline (pending_payment), the caller's reason or the window's end
-- (cancelled, expired, refunded), and who made the change.
ALTER TABLE order_events ADD COLUMN IF NOT EXISTS payment_id text;
ALTER TABLE order_events ADD COLUMN IF NOT EXISTS pay_by timestamptz;
ALTER TABLE order_events ADD COLUMN IF NOT EXISTS reason text;
ALTER TABLE order_events ADD COLUMN IF NOT EXISTS cause text;

CREATE OR REPLACE FUNCTION orders_inserted_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO order_events (order_id, version, type, request_id, sku, user_id, qty, status,
        pay_by, cause)
    SELECT n.order_id, n.version, 'order.' || n.status, n.request_id, n.sku, n.user_id,
        n.qty, n.status, n.pay_by, 'buyer'
    FROM inserted n;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION orders_changed_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO order_events (order_id, version, type, request_id, sku, user_id, qty, status,
        payment_id, reason, cause)
    SELECT n.order_id, n.version, 'order.' || n.status, n.request_id, n.sku, n.user_id,
        n.qty, n.status, n.payment_id, n.reason, n.cause
    FROM changed n JOIN previous p ON p.order_id = n.order_id
    WHERE n.status IS DISTINCT FROM p.status;
    RETURN NULL;
END
$$;
