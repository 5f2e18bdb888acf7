-- The transactional outbox (issue 32): every change of an order's status
-- writes its event in the same transaction as the change, by triggers on
-- `orders`, so no path (a flush, a strategy's own transaction, a pay, a
-- cancel, the expiry sweep, a gateway of the version before during a rolling
-- upgrade, an operator's psql) can change an order without its event, nor
-- write an event without its change.
-- Idempotent: every statement may run again on a database that has it.

-- An order's version: 1 when inserted, one more at each change of its status.
-- A column rather than a count of its events, which are pruned.
ALTER TABLE orders ADD COLUMN IF NOT EXISTS version integer NOT NULL DEFAULT 1;

-- One row per event; the relay (gateway/usecases/relay.py) delivers them.
-- seq: the order events were written in; version: 1, 2, ... per order, no gap.
-- No unique index on event_id nor on (order_id, version): each is a btree on
-- a random UUID that every flush pays for, per order (docs/performance.md, "what
-- the events cost"), and neither is needed. An event_id is gen_random_uuid()'s
-- 122 random bits; an order's version is bumped by the row trigger below while
-- the UPDATE holds the row's lock, so two changes never share one. The lookups
-- by event_id (a replay) go through the deliveries still owed.
CREATE TABLE IF NOT EXISTS order_events (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     uuid NOT NULL DEFAULT gen_random_uuid(),
    order_id     uuid NOT NULL,
    version      integer NOT NULL CHECK (version >= 1),
    type         text NOT NULL,
    request_id   text NOT NULL,
    sku          text NOT NULL,
    user_id      text NOT NULL,
    qty          integer NOT NULL,
    status       text NOT NULL,
    occurred_at  timestamptz NOT NULL DEFAULT now()
);

-- A status change bumps the version. A row trigger with a column list, so an
-- UPDATE of other columns (synced_at) runs nothing.
CREATE OR REPLACE FUNCTION orders_bump_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := OLD.version + 1;
    RETURN NEW;
END
$$;

-- Statement triggers with transition tables: one set-based INSERT per
-- statement, so a flush of a hundred orders writes its hundred events in one.
CREATE OR REPLACE FUNCTION orders_inserted_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO order_events (order_id, version, type, request_id, sku, user_id, qty, status)
    SELECT n.order_id, n.version, 'order.' || n.status, n.request_id, n.sku, n.user_id,
        n.qty, n.status
    FROM inserted n;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION orders_changed_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO order_events (order_id, version, type, request_id, sku, user_id, qty, status)
    SELECT n.order_id, n.version, 'order.' || n.status, n.request_id, n.sku, n.user_id,
        n.qty, n.status
    FROM changed n JOIN previous p ON p.order_id = n.order_id
    WHERE n.status IS DISTINCT FROM p.status;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS orders_version ON orders;
CREATE TRIGGER orders_version BEFORE UPDATE OF status ON orders
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION orders_bump_version();

DROP TRIGGER IF EXISTS orders_inserted ON orders;
CREATE TRIGGER orders_inserted AFTER INSERT ON orders
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION orders_inserted_events();

-- A trigger with transition tables takes no column list: it runs after every
-- UPDATE of orders, and the join keeps the rows whose status changed.
DROP TRIGGER IF EXISTS orders_changed ON orders;
CREATE TRIGGER orders_changed AFTER UPDATE ON orders
    REFERENCING OLD TABLE AS previous NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION orders_changed_events();
