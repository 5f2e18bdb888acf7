-- Each sink's deliveries of the outbox's events (issue 32): what the relay
-- (gateway/usecases/relay.py, through gateway/postgres/outbox.py) still owes
-- each sink, retries, and gave up on.
-- Idempotent: every statement may run again on a database that has it.

-- The sinks events are owed to: a relay registers each sink it delivers to
-- (stream, webhook, amqp) when it starts; an event is owed to the sinks
-- registered when it is written.
CREATE TABLE IF NOT EXISTS event_sinks (
    name           text PRIMARY KEY,
    registered_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per event and sink while the event is owed to the sink: inserted
-- with the event, deleted when the sink took it. So the table is the backlog,
-- not the history, and its indexes stay small and cached however long the
-- outbox keeps delivered events. A dead letter (dead_at set) stays until
-- replayed. The order, version and occurred_at are the event's, copied so the
-- relay's claim reads this table alone.
CREATE TABLE IF NOT EXISTS event_deliveries (
    sink         text NOT NULL,
    seq          bigint NOT NULL,
    order_id     uuid NOT NULL,
    version      integer NOT NULL,
    occurred_at  timestamptz NOT NULL,
    -- Since when the sink is owed it: the write, or the last replay; a
    -- dead letter is one owed longer than the sink's max age.
    owed_since   timestamptz NOT NULL DEFAULT now(),
    attempts     integer NOT NULL DEFAULT 0,
    -- Not tried before this time: the write, then the backoff after each
    -- failed attempt. The claim takes the due ones in this order.
    due_at       timestamptz NOT NULL DEFAULT now(),
    last_error   text,
    dead_at      timestamptz,
    PRIMARY KEY (sink, seq)
);

-- The claim's "no earlier version of this order still owed to this sink".
CREATE INDEX IF NOT EXISTS event_deliveries_order
    ON event_deliveries (sink, order_id, version);
-- The claim's "due now, oldest due first", without reading the rows waiting
-- out a backoff (a receiver down for hours leaves many). With the primary
-- key, three index entries per owed event, in indexes the size of the backlog.
CREATE INDEX IF NOT EXISTS event_deliveries_due
    ON event_deliveries (sink, due_at, seq) WHERE dead_at IS NULL;

-- Pruning deletes the delivered events older than GATEWAY_EVENTS_RETENTION_S
-- by time. A BRIN index: a few pages for the whole table, and an insert at
-- the table's end costs nothing while its block range is not yet summarised
-- (autovacuum summarises it), so the flush does not pay for it as it would
-- for a btree.
CREATE INDEX IF NOT EXISTS order_events_occurred_at
    ON order_events USING brin (occurred_at);

-- The deliveries of the events a statement wrote: one set-based INSERT per
-- statement, as the outbox's own trigger (sql/010_order_events.sql).
CREATE OR REPLACE FUNCTION order_events_owed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_deliveries (sink, seq, order_id, version, occurred_at)
    SELECT s.name, a.seq, a.order_id, a.version, a.occurred_at
    FROM added a CROSS JOIN event_sinks s;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS order_events_owed ON order_events;
CREATE TRIGGER order_events_owed AFTER INSERT ON order_events
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION order_events_owed();
