-- The order lifecycle after the 201 (issue 31): a sku's payment window, an
-- order's status and deadline, and the payments that came too late.
-- Idempotent: every statement may run again on a database that has it.

-- Seconds a buyer has to pay; 0: none, the order is final at its 201.
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS payment_window_s integer NOT NULL DEFAULT 0
    CHECK (payment_window_s >= 0);

-- confirmed: final at its 201 (no window). pending_payment: holds its units
-- until pay_by (PostgreSQL's clock); then paid, or cancelled / expired with its
-- units back on sale. closed_at: when it left pending. synced_at: when Redis
-- was told of that last transition (the units back); NULL while owed.
ALTER TABLE orders ADD COLUMN IF NOT EXISTS status text NOT NULL DEFAULT 'confirmed'
    CHECK (status IN ('confirmed', 'pending_payment', 'paid', 'cancelled', 'expired'));
ALTER TABLE orders ADD COLUMN IF NOT EXISTS pay_by timestamptz;
ALTER TABLE orders ADD COLUMN IF NOT EXISTS payment_id text UNIQUE;
ALTER TABLE orders ADD COLUMN IF NOT EXISTS closed_at timestamptz;
ALTER TABLE orders ADD COLUMN IF NOT EXISTS synced_at timestamptz;

-- One order per buyer and sku among live orders only: an expired or cancelled
-- buyer may buy again.
CREATE UNIQUE INDEX IF NOT EXISTS orders_live_buyer ON orders (sku, user_id)
    WHERE status IN ('confirmed', 'pending_payment', 'paid');
DO $$
DECLARE
    v_name text;
BEGIN
    SELECT conname INTO v_name FROM pg_constraint
    WHERE conrelid = 'orders'::regclass AND contype = 'u' AND cardinality(conkey) = 2;
    IF v_name IS NOT NULL THEN
        EXECUTE format('ALTER TABLE orders DROP CONSTRAINT %I', v_name);
    END IF;
END
$$;

-- A buyer's orders of every status, as the unique (sku, user_id) served them
-- before: the flush_batch of the version before (a rolling upgrade runs it on
-- this schema) looks a buyer up without a status, which the partial index
-- above cannot serve; without this, its every flush scanned the sku's orders.
CREATE INDEX IF NOT EXISTS orders_buyer ON orders (sku, user_id);

-- The sweep's due orders, and the returns still owed to Redis.
CREATE INDEX IF NOT EXISTS orders_pending_pay_by ON orders (pay_by)
    WHERE status = 'pending_payment';
-- A sku's held units and earliest deadline (a sold out's "held" and Retry-After).
CREATE INDEX IF NOT EXISTS orders_pending_sku ON orders (sku, pay_by)
    WHERE status = 'pending_payment';
CREATE INDEX IF NOT EXISTS orders_unsynced ON orders (sku)
    WHERE status IN ('expired', 'cancelled') AND synced_at IS NULL;

-- A payment that lost to an expiry or a cancel: it took no unit, and is
-- listed for refund (GET /admin/late-payments, the audit).
CREATE TABLE IF NOT EXISTS late_payments (
    payment_id   text PRIMARY KEY,
    request_id   text NOT NULL,
    order_id     uuid,
    reason       text NOT NULL CHECK (reason IN ('expired', 'cancelled')),
    received_at  timestamptz NOT NULL DEFAULT now()
);
