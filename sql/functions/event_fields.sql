-- event_fields: an order event as every sink receives it, rendered once, by
-- PostgreSQL, in the relay's claim (gateway/postgres/outbox.py).
--
-- The result is the event's fields as the stream carries them: name, value,
-- name, value..., every value text, in this order: event_id, type, order_id,
-- request_id, sku, user_id, qty, status, version, occurred_at, then payment_id,
-- pay_by, reason and cause each only when not NULL. Instants are RFC 3339 in
-- UTC to the millisecond (truncated), as the API writes them
-- (gateway.domain.rules.rfc3339). gateway.domain.events.OrderEvent reads the
-- array by these positions; docs/order-event.schema.json describes the JSON
-- the webhook and RabbitMQ get from it.
--
-- Why here: the relay's share of a durable order's CPU was mostly Python
-- turning typed columns into these strings, one event at a time (issue 42);
-- PostgreSQL makes the array while it reads the row.
--
-- Needs migration 015 (the event's payment_id, pay_by, reason and cause).
-- A function, not a migration: the migrations apply this file again whenever
-- its text changes (gateway/postgres/database.py). A single-SELECT SQL
-- function, so the planner inlines it into the claim.
CREATE OR REPLACE FUNCTION event_fields(e order_events) RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT ARRAY[
        'event_id', e.event_id::text,
        'type', e.type,
        'order_id', e.order_id::text,
        'request_id', e.request_id,
        'sku', e.sku,
        'user_id', e.user_id,
        'qty', e.qty::text,
        'status', e.status,
        'version', e.version::text,
        'occurred_at',
        to_char(e.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')]
    || CASE WHEN e.payment_id IS NULL THEN '{}'::text[]
        ELSE ARRAY['payment_id', e.payment_id] END
    || CASE WHEN e.pay_by IS NULL THEN '{}'::text[]
        ELSE ARRAY['pay_by',
            to_char(e.pay_by AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')] END
    || CASE WHEN e.reason IS NULL THEN '{}'::text[] ELSE ARRAY['reason', e.reason] END
    || CASE WHEN e.cause IS NULL THEN '{}'::text[] ELSE ARRAY['cause', e.cause] END
$$;
