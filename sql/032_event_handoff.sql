-- A flush hands its new orders' first events to the stream itself (issue 42).
-- Idempotent: every statement may run again on a database that has it.
--
-- The relay reads each event back from order_events, has PostgreSQL pack it
-- and hands it on: about 11 µs of the stack's CPU an event (docs/performance.md,
-- "The whole stack on one core"). A flush's new orders are already in the flushing gateway's
-- hands when the flush commits, and their first events are made of what it
-- holds: so the gateway appends them to the stream straight after the commit
-- (gateway/usecases/handoff.py), and then tells the outbox they landed. The
-- outbox stays the fallback: the stream's batch row of such a flush is written
-- as always, marked with the flush's hand-off token and not claimable by a
-- relay for HANDOFF_GRACE (below); the gateway's word deletes it, and if that
-- word never comes (the gateway died, Redis refused) a relay delivers the
-- batch once the grace is over, as it would any other.

-- The flush's token (a random number the gateway chose) on the hand-off sink's
-- batch row, and when a relay may claim the row: NULL, at once.
ALTER TABLE event_batches ADD COLUMN IF NOT EXISTS handoff bigint;
ALTER TABLE event_batches ADD COLUMN IF NOT EXISTS claimable_at timestamptz;

-- An order's first event takes the order's id as its event id, so a gateway
-- that hands it off knows it without asking: the relay delivering the same
-- event later (the fallback) sends the same event_id, and a consumer that
-- drops an event_id it has seen drops the second copy. Every later version
-- keeps a random one. (Before this, version 1 had a random one too.)
CREATE OR REPLACE FUNCTION orders_inserted_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO order_events (event_id, order_id, version, type, request_id, sku, user_id, qty,
        status, pay_by, cause)
    SELECT n.order_id, n.order_id, n.version, 'order.' || n.status, n.request_id, n.sku,
        n.user_id, n.qty, n.status, n.pay_by, 'buyer'
    FROM inserted n;
    RETURN NULL;
END
$$;

-- As in sql/011_event_delivery.sql, and: while flush_batch() hands its first
-- versions off (the transaction's flashsale.handoff names the sink, and
-- flashsale.handoff_token the flush's token), that sink's batch row carries the
-- token and waits out the grace (5 s) before a relay may claim it.
CREATE OR REPLACE FUNCTION order_events_owed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_sink text := nullif(current_setting('flashsale.handoff', true), '');
    v_token bigint := nullif(current_setting('flashsale.handoff_token', true), '')::bigint;
BEGIN
    INSERT INTO event_batches (sink, first_seq, seqs, handoff, claimable_at)
    SELECT s.name, b.first_seq, b.seqs,
        CASE WHEN s.name = v_sink THEN v_token END,
        CASE WHEN s.name = v_sink THEN now() + interval '5 seconds' END
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
