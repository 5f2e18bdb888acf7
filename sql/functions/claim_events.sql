-- claim_events: a relay's claim of up to p_limit events owed to sink p_sink,
-- in one round trip (gateway/postgres/outbox.py, sql/011_event_delivery.sql).
--
-- Called inside the claim's transaction, which lasts while the relay delivers
-- the events and records the outcome: the rows it locks (FOR UPDATE SKIP
-- LOCKED) are skipped by every other relay until then, and are due again at
-- once if the relay dies.
--
-- First the events owed one by one (event_deliveries): due now, oldest due
-- first, the lowest version owed of each order; a later version waits out
-- every batch older than it (its order's first version may be in one).
-- Then batches (event_batches, a statement's new orders, never tried), the
-- oldest first, but none a flush is still handing off itself (claimable_at,
-- sql/032_event_handoff.sql), until p_limit events are claimed: the last one taken is split
-- when it does not fit, its first events claimed and the rest left a batch of
-- its own, which starts later (a later version of one of its orders still
-- waits for it). So a claim never holds more than p_limit events, however
-- many rows one statement wrote (a bulk INSERT of 100,000 orders was one
-- batch, and a relay claiming it whole stalled its event loop for seconds).
-- The batches taken are deleted: an event of one that the sink refuses
-- becomes owed one by one when the outcome is recorded.
-- The events owed one by one come first because a later version that waits
-- out an older batch must see the batches this claim takes.
--
-- Returns per event: seq, its fields as sinks get them (event_fields), or with
-- p_packed its fields packed for the stream's XADD (event_packed;
-- the other column then empty), the failed attempts so far, whether it came
-- from a batch (fresh), and when it occurred (epoch seconds: the delivery lag
-- counts from there); those owed one by one first, each part in seq order.
--
-- Each event is read by its own probe of order_events' primary key (a LATERAL
-- subquery the planner may not flatten, OFFSET 0): given the seqs as an array,
-- = ANY (...), it chose a sequential scan of the whole table from a few
-- hundred seqs on, so a claim cost grew with the events kept (30,000 rows:
-- 3.6 ms a claim of 256, 14 µs an event; by probes 1.0 ms).
--
-- Why a function: the claim was 3 statements and a round trip per batch
-- taken, and a flush writes a batch per sku; the relay's round trips were a
-- large part of what the events cost a durable order (issue 42).
--
-- Needs migration 015 (through event_fields and event_packed) and 032.
-- A function, not a migration: the migrations apply this file again whenever
-- its text changes (gateway/postgres/database.py). p_packed made the return
-- type grow (packed), which CREATE OR REPLACE cannot change: this version is an
-- overload beside the two-argument one a gateway of the version before calls,
-- still running (or restarting, and applying its own text) during a rolling
-- upgrade.
CREATE OR REPLACE FUNCTION claim_events(p_sink text, p_limit integer, p_packed boolean)
RETURNS TABLE (
    seq bigint, fields text[], packed text, attempts integer, fresh boolean,
    occurred double precision
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    owed integer;
    room integer;
    after bigint := -1;
    taken bigint[] := '{}';
    fresh_seqs bigint[] := '{}';
    next_first bigint;
    next_seqs bigint[];
BEGIN
    RETURN QUERY
    WITH claimed AS (
        SELECT d.seq, d.attempts FROM event_deliveries d
        WHERE d.sink = p_sink AND d.dead_at IS NULL AND d.due_at <= now()
            AND NOT EXISTS (
                SELECT 1 FROM event_deliveries p
                WHERE p.sink = d.sink AND p.order_id = d.order_id AND p.version < d.version)
            AND (d.version = 1 OR NOT EXISTS (
                SELECT 1 FROM event_batches b WHERE b.sink = d.sink AND b.first_seq < d.seq))
        ORDER BY d.due_at, d.seq LIMIT p_limit
        FOR UPDATE OF d SKIP LOCKED
    )
    SELECT e.seq, CASE WHEN p_packed THEN '{}' ELSE event_fields(e) END,
        CASE WHEN p_packed THEN event_packed(e) ELSE '' END, c.attempts, false,
        extract(epoch FROM e.occurred_at)::float8
    FROM claimed c
    CROSS JOIN LATERAL (SELECT * FROM order_events o WHERE o.seq = c.seq OFFSET 0) e
    ORDER BY e.seq;
    GET DIAGNOSTICS owed = ROW_COUNT;
    room := p_limit - owed;
    WHILE room > 0 LOOP
        SELECT b.first_seq, b.seqs INTO next_first, next_seqs
        FROM event_batches b
        WHERE b.sink = p_sink AND b.first_seq > after
            AND (b.claimable_at IS NULL OR b.claimable_at <= now())
        ORDER BY b.first_seq LIMIT 1
        FOR UPDATE SKIP LOCKED;
        EXIT WHEN NOT FOUND;
        taken := taken || next_first;
        after := next_first;
        IF cardinality(next_seqs) > room THEN
            INSERT INTO event_batches (sink, first_seq, seqs)
            VALUES (p_sink, next_seqs[room + 1], next_seqs[room + 1:]);
            next_seqs := next_seqs[:room];
        END IF;
        fresh_seqs := fresh_seqs || next_seqs;
        room := room - cardinality(next_seqs);
    END LOOP;
    IF cardinality(taken) > 0 THEN
        DELETE FROM event_batches b WHERE b.sink = p_sink AND b.first_seq = ANY (taken);
        RETURN QUERY
        SELECT e.seq, CASE WHEN p_packed THEN '{}' ELSE event_fields(e) END,
            CASE WHEN p_packed THEN event_packed(e) ELSE '' END, 0, true,
            extract(epoch FROM e.occurred_at)::float8
        FROM unnest(fresh_seqs) AS u(seq)
        CROSS JOIN LATERAL (SELECT * FROM order_events o WHERE o.seq = u.seq OFFSET 0) e
        ORDER BY e.seq;
    END IF;
END
$$;
