-- Inventory, orders and the record of every stock change.
-- Idempotent: every statement may run again on a database that has it.

CREATE TABLE IF NOT EXISTS inventory (
    sku             text PRIMARY KEY,
    stock           bigint NOT NULL CHECK (stock >= 0),
    per_user_limit  integer NOT NULL DEFAULT 1 CHECK (per_user_limit >= 1),
    -- Highest fencing token that has written this row; a flush carrying a
    -- smaller token comes from a holder whose lock already expired.
    fence           bigint NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS orders (
    order_id    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    request_id  text NOT NULL UNIQUE,
    sku         text NOT NULL REFERENCES inventory (sku),
    user_id     text NOT NULL,
    qty         integer NOT NULL CHECK (qty > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (sku, user_id)
);

-- Every stock the admin API provided or took away, written in the same
-- transaction as the change, so an audit can compare units sold with units
-- ever provided.
CREATE TABLE IF NOT EXISTS stock_movements (
    movement_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sku          text NOT NULL REFERENCES inventory (sku),
    delta        bigint NOT NULL,
    reason       text NOT NULL,
    stock_after  bigint NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS stock_movements_sku ON stock_movements (sku);
