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

-- What each sink is still owed, in two shapes (issue 32's cost: the flush
-- writes the first, a row per batch, not a row per order):
-- * event_batches: one row per sink and statement that wrote first versions
--   (a flush's new orders), their seqs in an array; never tried yet. A claim
--   takes whole rows, FOR UPDATE SKIP LOCKED, and deletes them.
-- * event_deliveries: one row per event and sink for the rest: the later
--   versions (a pay, a cancel, an expiry), and every event of a batch that a
--   sink refused, with its attempts, backoff and dead letter.
-- Both are the backlog, not the history: a row goes when its sink took it.
CREATE TABLE IF NOT EXISTS event_batches (
    sink       text NOT NULL,
    -- The lowest seq of the batch: a later version of an order waits until no
    -- batch older than it is left (its first version may be in one).
    first_seq  bigint NOT NULL,
    seqs       bigint[] NOT NULL,
    PRIMARY KEY (sink, first_seq)
);

-- One row per event and sink while the event is owed to the sink outside a
-- batch. A dead letter (dead_at set) stays until replayed. The order, version
-- and occurred_at are the event's, copied so the relay's claim reads this
-- table alone.
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

-- What the sinks are owed of the events a statement wrote: one batch row
-- per sink for the first versions, a delivery row per event and sink for the
-- later ones; set-based, as the outbox's own trigger (sql/010_order_events.sql).
CREATE OR REPLACE FUNCTION order_events_owed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_batches (sink, first_seq, seqs)
    SELECT s.name, b.first_seq, b.seqs
    FROM (SELECT min(a.seq) AS first_seq, array_agg(a.seq ORDER BY a.seq) AS seqs
          FROM added a WHERE a.version = 1) b
    CROSS JOIN event_sinks s
    WHERE b.first_seq IS NOT NULL;
    INSERT INTO event_deliveries (sink, seq, order_id, version, occurred_at)
    SELECT s.name, a.seq, a.order_id, a.version, a.occurred_at
    FROM added a CROSS JOIN event_sinks s WHERE a.version > 1;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS order_events_owed ON order_events;
CREATE TRIGGER order_events_owed AFTER INSERT ON order_events
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION order_events_owed();

-- Every event owed, whatever its shape: the listing, the gauges, the stream's
-- trim and the pruning read this.
CREATE OR REPLACE VIEW events_owed AS
SELECT d.sink, d.seq, d.order_id, d.version, d.occurred_at, d.owed_since, d.attempts,
    d.last_error, d.dead_at
FROM event_deliveries d
UNION ALL
SELECT b.sink, e.seq, e.order_id, e.version, e.occurred_at, e.occurred_at, 0, NULL, NULL
FROM event_batches b CROSS JOIN LATERAL unnest(b.seqs) AS u(seq)
JOIN order_events e ON e.seq = u.seq;
