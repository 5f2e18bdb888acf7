-- flush_batch: decide and write one batch of reserved purchases in one round trip.
--
-- Called once per flush, as a single statement (its own transaction). Locks the
-- sku's inventory row, so writers of one sku queue here; then one statement
-- looks up every purchase's prior order, released reservation and the buyer's
-- order of this sku (per-purchase queries held the row locked longer:
-- docs/performance.md), and in arrival order each purchase is
--   C  a replay: an order with this request id exists (same sku, buyer and qty)
--   R  the request id holds an order of another sku, buyer or qty: the
--      reservation is released and the client told of the mismatch
--   D  a duplicate: the buyer already holds an order of this sku
--   L  group limit: the sku is in a limit group, and the buyer's units held
--      across the group's skus (group_holdings, sql/020_limit_groups.sql) and
--      this purchase's would pass the group's per_user_limit; the row names
--      the group in order_status
--   G  granted: it fits in the stock left (then inserted and returned as C)
--   S  sold out: it does not fit
--   X  expired: the reconciler released this reservation, or a gateway told
--      its request id sold out after Redis failed (a release at that moment:
--      every reservation of the request id made before it); its buyer retries
-- and the granted units are taken by one UPDATE guarded by stock >= total and
-- the fencing token. A fencing token older than the row's raises SQLSTATE
-- FS001 (gateway.domain.errors.FencedOut); a guard that refuses raises FS002
-- (gateway.domain.errors.StockGuardRefused). Either way nothing is written.
--
-- The verdict letters are gateway.domain.model.Verdict's values.
--
-- A function, not a migration: the migrations apply this file again whenever
-- its text changes (gateway/postgres/database.py).
--
-- An order of a sku with a payment window is inserted pending_payment with its
-- pay_by (now() + the window); a buyer's order counts as "bought" only while it
-- is live (confirmed, pending_payment, paid).
--
-- A sku in a limit group reads its buyers' holdings (group_holdings) as
-- committed, without locking them: Redis's reservation already decided each
-- buyer across the group's skus, so two flushes of one group hold the same
-- buyer only when Redis was wrong. The insert trigger (orders_group_held)
-- adds the granted units under the rows' locks and refuses the statement
-- (FS003, gateway.domain.errors.GroupGuardRefused: 503, the batch given back)
-- if a buyer would pass the limit; the purchases sent again are then decided
-- here, L. Locking the rows first (made when missing) halved a grouped sku's
-- in-stock throughput (make ab BASE=HEAD AB_ARGS=--head-limit-group=10).
--
-- Returns one row per distinct request id: request_id, verdict (C, R, D, S, X or L),
-- the order's id, sku, user, qty, status and pay_by (C and R), the stock
-- after the batch, whether the order is new (inserted by this call: its first
-- event was written now), and on the first new order's row only, the flush's
-- now() (when those events occurred; a NULL costs the gateway no decoding).
-- With p_handoff (a sink's name) and p_token, the new orders' first events are
-- the flushing gateway's to hand to that sink (sql/032_event_handoff.sql):
-- the sink's batch row of them carries p_token and waits out the grace.
-- p_lifecycle is not read. The return type grew (order_fresh, occurred), which
-- CREATE OR REPLACE cannot change, so this version is an overload beside the
-- seven-argument one a gateway of the version before calls, still running
-- during a rolling upgrade; that one is now this one without a hand-off.
CREATE OR REPLACE FUNCTION flush_batch(
    p_sku text, p_request_ids text[], p_user_ids text[], p_qtys integer[],
    p_reserved_at bigint[], p_fence bigint, p_lifecycle integer, p_handoff text, p_token bigint
) RETURNS TABLE (
    request_id text, verdict text, order_id text, order_sku text, order_user text,
    order_qty integer, stock_after bigint, order_status text, order_pay_by timestamptz,
    order_fresh boolean, occurred timestamptz
) LANGUAGE plpgsql AS $$
DECLARE
    v_stock bigint;
    v_fence bigint;
    v_window integer;
    v_group text;
    v_limit integer;
    v_left bigint;
    v_total bigint := 0;
    rec record;
    v_buyers text[] := '{}';
    g_rids text[] := '{}';
    g_users text[] := '{}';
    g_qtys integer[] := '{}';
    d_rids text[] := '{}';
    d_verdicts text[] := '{}';
    d_orders text[] := '{}';
    d_skus text[] := '{}';
    d_users text[] := '{}';
    d_qtys integer[] := '{}';
    d_statuses text[] := '{}';
    d_pay_bys timestamptz[] := '{}';
BEGIN
    IF p_handoff IS NOT NULL THEN
        -- Read by the outbox's trigger (order_events_owed); local to this
        -- transaction, as the flush is one statement.
        PERFORM set_config('flashsale.handoff', p_handoff, true),
            set_config('flashsale.handoff_token', p_token::text, true);
    END IF;
    SELECT inv.stock, inv.fence, inv.payment_window_s, inv.limit_group
    INTO v_stock, v_fence, v_window, v_group
    FROM inventory inv WHERE inv.sku = p_sku FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT DISTINCT r, 'S'::text, NULL::text, NULL::text, NULL::text,
            NULL::integer, 0::bigint, NULL::text, NULL::timestamptz, false, NULL::timestamptz
            FROM unnest(p_request_ids) AS r;
        RETURN;
    END IF;
    IF p_fence IS NOT NULL AND v_fence > p_fence THEN
        RAISE EXCEPTION 'fenced out: token % is older than %', p_fence, v_fence
            USING ERRCODE = 'FS001';
    END IF;
    v_left := v_stock;
    IF v_group IS NOT NULL THEN
        SELECT lg.per_user_limit INTO v_limit FROM limit_groups lg WHERE lg.limit_group = v_group;
    END IF;
    -- Every lookup in one statement, in arrival order, the first occurrence of
    -- each request id only: the loop below decides in memory.
    FOR rec IN
        SELECT t.r, t.u, t.q, o.order_id AS o_id, o.sku AS o_sku, o.user_id AS o_user,
            o.qty AS o_qty, o.status AS o_status, o.pay_by AS o_pay_by,
            (o.order_id IS NULL AND EXISTS (
                SELECT 1 FROM released_reservations rr
                WHERE rr.request_id = t.r AND rr.reserved_at_ms >= t.ra)) AS released,
            (o.order_id IS NULL AND EXISTS (
                SELECT 1 FROM orders b WHERE b.sku = p_sku AND b.user_id = t.u
                AND b.status IN ('confirmed', 'pending_payment', 'paid'))) AS bought,
            t.entries_of_user > 1 AS again,
            CASE WHEN v_group IS NULL THEN 0 ELSE COALESCE((
                SELECT h.units FROM group_holdings h
                WHERE h.limit_group = v_group AND h.user_id = t.u), 0) END AS held
        FROM (
            SELECT x.r, x.u, x.q, x.ra, x.i,
                row_number() OVER (PARTITION BY x.r ORDER BY x.i) AS nth,
                count(*) OVER (PARTITION BY x.u) AS entries_of_user
            FROM unnest(p_request_ids, p_user_ids, p_qtys, p_reserved_at)
                WITH ORDINALITY AS x(r, u, q, ra, i)
        ) t
        LEFT JOIN orders o ON o.request_id = t.r
        WHERE t.nth = 1
        ORDER BY t.i
    LOOP
        IF rec.o_id IS NOT NULL THEN
            d_rids := d_rids || rec.r;
            d_verdicts := d_verdicts || CASE
                WHEN rec.o_sku = p_sku AND rec.o_user = rec.u AND rec.o_qty = rec.q THEN 'C'
                ELSE 'R' END;
            d_orders := d_orders || rec.o_id::text;
            d_skus := d_skus || rec.o_sku;
            d_users := d_users || rec.o_user;
            d_qtys := d_qtys || rec.o_qty;
            d_statuses := d_statuses || rec.o_status;
            d_pay_bys := d_pay_bys || rec.o_pay_by;
        ELSIF rec.released THEN
            d_rids := d_rids || rec.r;
            d_verdicts := d_verdicts || 'X'::text;
            d_orders := d_orders || NULL::text;
            d_skus := d_skus || NULL::text;
            d_users := d_users || NULL::text;
            d_qtys := d_qtys || NULL::integer;
            d_statuses := d_statuses || NULL::text;
            d_pay_bys := d_pay_bys || NULL::timestamptz;
        -- Only a buyer with another entry in this batch can be among the buyers
        -- granted so far: the scan of v_buyers, which grows with the batch, is
        -- skipped for everyone else (it grows with the square of the batch:
        -- docs/performance.md, "the in-batch buyer scan").
        ELSIF rec.bought OR (rec.again AND rec.u = ANY (v_buyers)) THEN
            d_rids := d_rids || rec.r;
            d_verdicts := d_verdicts || 'D'::text;
            d_orders := d_orders || NULL::text;
            d_skus := d_skus || NULL::text;
            d_users := d_users || NULL::text;
            d_qtys := d_qtys || NULL::integer;
            d_statuses := d_statuses || NULL::text;
            d_pay_bys := d_pay_bys || NULL::timestamptz;
        ELSIF v_limit IS NOT NULL AND rec.held + rec.q > v_limit THEN
            d_rids := d_rids || rec.r;
            d_verdicts := d_verdicts || 'L'::text;
            d_orders := d_orders || NULL::text;
            d_skus := d_skus || NULL::text;
            d_users := d_users || NULL::text;
            d_qtys := d_qtys || NULL::integer;
            d_statuses := d_statuses || v_group;
            d_pay_bys := d_pay_bys || NULL::timestamptz;
        ELSIF rec.q <= v_left THEN
            v_left := v_left - rec.q;
            v_total := v_total + rec.q;
            v_buyers := v_buyers || rec.u;
            g_rids := g_rids || rec.r;
            g_users := g_users || rec.u;
            g_qtys := g_qtys || rec.q;
        ELSE
            d_rids := d_rids || rec.r;
            d_verdicts := d_verdicts || 'S'::text;
            d_orders := d_orders || NULL::text;
            d_skus := d_skus || NULL::text;
            d_users := d_users || NULL::text;
            d_qtys := d_qtys || NULL::integer;
            d_statuses := d_statuses || NULL::text;
            d_pay_bys := d_pay_bys || NULL::timestamptz;
        END IF;
    END LOOP;
    IF v_total > 0 THEN
        -- The floor against overselling, whatever was decided above.
        UPDATE inventory SET stock = stock - v_total, fence = COALESCE(p_fence, fence),
            updated_at = now()
        WHERE sku = p_sku AND stock >= v_total AND (p_fence IS NULL OR fence <= p_fence)
        RETURNING stock INTO v_stock;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the stock guard refused % units', v_total USING ERRCODE = 'FS002';
        END IF;
        RETURN QUERY
        INSERT INTO orders AS o (request_id, sku, user_id, qty, status, pay_by)
        SELECT r, p_sku, u, q,
            CASE WHEN v_window > 0 THEN 'pending_payment' ELSE 'confirmed' END,
            CASE WHEN v_window > 0 THEN now() + make_interval(secs => v_window) END
        FROM unnest(g_rids, g_users, g_qtys) AS t(r, u, q)
        RETURNING o.request_id, 'C'::text, o.order_id::text, o.sku, o.user_id, o.qty, v_stock,
            o.status, o.pay_by, true, CASE WHEN o.request_id = g_rids[1] THEN now() END;
    END IF;
    RETURN QUERY SELECT t.r, t.v, t.oid, t.s, t.u, t.q, v_stock, t.st, t.pb, false,
        NULL::timestamptz
        FROM unnest(d_rids, d_verdicts, d_orders, d_skus, d_users, d_qtys, d_statuses, d_pay_bys)
        AS t(r, v, oid, s, u, q, st, pb);
END
$$;

-- The version before, as a gateway of that version calls it: no hand-off.
CREATE OR REPLACE FUNCTION flush_batch(
    p_sku text, p_request_ids text[], p_user_ids text[], p_qtys integer[],
    p_reserved_at bigint[], p_fence bigint, p_lifecycle integer
) RETURNS TABLE (
    request_id text, verdict text, order_id text, order_sku text, order_user text,
    order_qty integer, stock_after bigint, order_status text, order_pay_by timestamptz
) LANGUAGE sql AS $$
    SELECT f.request_id, f.verdict, f.order_id, f.order_sku, f.order_user, f.order_qty,
        f.stock_after, f.order_status, f.order_pay_by
    FROM flush_batch(p_sku, p_request_ids, p_user_ids, p_qtys, p_reserved_at, p_fence,
        p_lifecycle, NULL, NULL) f
$$;
