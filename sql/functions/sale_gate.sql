-- sale_gate: a purchase's sale window and rate limits, for the strategies that
-- decide in PostgreSQL alone (sql-direct, optimistic, pessimistic).
--
-- The same rules, in the same order, as lua/reserve.lua decides them for
-- reserve-batch and queue, by PostgreSQL's clock instead of Redis's:
--   1. a request id that already has an order passes (its replay, or the 422
--      of another payload, is the strategy's to answer, whatever the window);
--   2. before the sku's starts_at: not_started, with the ms to the start;
--      at or after its ends_at: ended;
--   3. the token buckets of the user and of the client address (rates of 0:
--      off): one token from each, all or none; when one is empty the answer
--      is rate_limited with the ms until it holds a token again, unless too
--      little stock is left for qty (sold out beats rate limited: the strategy
--      answers it).
-- The buckets are rows of rate_buckets (sql/006_rate_buckets.sql), locked user
-- first, then client, so two gates never wait on each other in a cycle; called
-- as one statement, its own transaction, they are held only that long.
--
-- A function, not a migration: the migrations apply this file again whenever
-- its text changes (gateway/postgres/database.py).
--
-- Returns verdict ('pass', 'not_started', 'ended', 'rate_limited') and wait_ms
-- (not_started and rate_limited; else 0).
CREATE OR REPLACE FUNCTION sale_gate(
    p_sku text, p_request_id text, p_qty integer,
    p_user_bucket text, p_user_rate double precision, p_user_burst integer,
    p_client_bucket text, p_client_rate double precision, p_client_burst integer,
    OUT verdict text, OUT wait_ms bigint
) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
    v_row record;
    v_buckets text[] := ARRAY[p_user_bucket, p_client_bucket];
    v_rates double precision[] := ARRAY[p_user_rate, p_client_rate];
    v_bursts integer[] := ARRAY[p_user_burst, p_client_burst];
    v_tokens double precision[] := ARRAY[NULL, NULL]::double precision[];
    v_saved record;
    v_wait bigint := 0;
BEGIN
    verdict := 'pass';
    wait_ms := 0;
    IF EXISTS (SELECT 1 FROM orders o WHERE o.request_id = p_request_id) THEN
        RETURN;
    END IF;
    SELECT i.stock, i.starts_at, i.ends_at INTO v_row FROM inventory i WHERE i.sku = p_sku;
    IF NOT FOUND THEN
        RETURN;  -- the strategy answers for a sku that vanished
    END IF;
    IF v_row.starts_at IS NOT NULL AND v_now < v_row.starts_at THEN
        verdict := 'not_started';
        wait_ms := ceil(extract(epoch FROM v_row.starts_at - v_now) * 1000);
        RETURN;
    END IF;
    IF v_row.ends_at IS NOT NULL AND v_now >= v_row.ends_at THEN
        verdict := 'ended';
        RETURN;
    END IF;
    FOR b IN 1..2 LOOP
        CONTINUE WHEN v_buckets[b] = '' OR v_rates[b] <= 0;
        INSERT INTO rate_buckets AS r (sku, bucket, tokens, at, expires_at)
        VALUES (p_sku, v_buckets[b], v_bursts[b], v_now, v_now)
        ON CONFLICT (sku, bucket) DO NOTHING;
        SELECT r.tokens, r.at INTO v_saved FROM rate_buckets r
        WHERE r.sku = p_sku AND r.bucket = v_buckets[b] FOR UPDATE;
        v_tokens[b] := least(
            v_bursts[b]::double precision,
            v_saved.tokens + greatest(0, extract(epoch FROM v_now - v_saved.at)) * v_rates[b]
        );
        IF v_tokens[b] < 1 THEN
            v_wait := greatest(v_wait, ceil((1 - v_tokens[b]) * 1000 / v_rates[b])::bigint);
        END IF;
    END LOOP;
    IF v_wait > 0 THEN
        IF v_row.stock >= p_qty THEN
            verdict := 'rate_limited';
            wait_ms := v_wait;
        END IF;
        RETURN;
    END IF;
    FOR b IN 1..2 LOOP
        CONTINUE WHEN v_tokens[b] IS NULL;
        UPDATE rate_buckets r
        SET tokens = v_tokens[b] - 1, at = v_now,
            expires_at = v_now + make_interval(secs => v_bursts[b] / v_rates[b] + 1)
        WHERE r.sku = p_sku AND r.bucket = v_buckets[b];
    END LOOP;
END;
$$;
