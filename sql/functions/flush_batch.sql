-- flush_batch: decide and write one batch of reserved purchases in one round trip.
--
-- Called once per flush, as a single statement (its own transaction). Locks the
-- sku's inventory row, so writers of one sku queue here; then, in arrival
-- order, each purchase is
--   C  a replay: an order with this request id exists (same sku, buyer and qty)
--   R  the request id holds an order of another sku, buyer or qty: the
--      reservation is released and the client told of the mismatch
--   D  a duplicate: the buyer already holds an order of this sku
--   G  granted: it fits in the stock left (then inserted and returned as C)
--   S  sold out: it does not fit
--   X  expired: the reconciler released this reservation; its buyer retries
-- and the granted units are taken by one UPDATE guarded by stock >= total and
-- the fencing token. A fencing token older than the row's raises SQLSTATE
-- FS001 (gateway.errors.FencedOut); a guard that refuses raises FS002
-- (gateway.errors.StockGuardRefused). Either way nothing is written.
--
-- The verdict letters are gateway.domain.Verdict's values.
--
-- A function, not a migration: the migrations apply this file again whenever
-- its text changes (gateway/database.py).
--
-- Returns one row per distinct request id: request_id, verdict (C, R, D, S or X),
-- the order's id, sku, user and qty (C and R), and the stock after the batch.
CREATE OR REPLACE FUNCTION flush_batch(
    p_sku text, p_request_ids text[], p_user_ids text[], p_qtys integer[],
    p_reserved_at bigint[], p_fence bigint
) RETURNS TABLE (
    request_id text, verdict text, order_id text, order_sku text, order_user text,
    order_qty integer, stock_after bigint
) LANGUAGE plpgsql AS $$
DECLARE
    v_stock bigint;
    v_fence bigint;
    v_left bigint;
    v_total bigint := 0;
    v_prior orders%ROWTYPE;
    v_seen text[] := '{}';
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
BEGIN
    SELECT inv.stock, inv.fence INTO v_stock, v_fence
    FROM inventory inv WHERE inv.sku = p_sku FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT DISTINCT r, 'S'::text, NULL::text, NULL::text, NULL::text,
            NULL::integer, 0::bigint FROM unnest(p_request_ids) AS r;
        RETURN;
    END IF;
    IF p_fence IS NOT NULL AND v_fence > p_fence THEN
        RAISE EXCEPTION 'fenced out: token % is older than %', p_fence, v_fence
            USING ERRCODE = 'FS001';
    END IF;
    v_left := v_stock;
    FOR i IN 1 .. coalesce(array_length(p_request_ids, 1), 0) LOOP
        CONTINUE WHEN p_request_ids[i] = ANY (v_seen);
        v_seen := v_seen || p_request_ids[i];
        SELECT * INTO v_prior FROM orders o WHERE o.request_id = p_request_ids[i];
        IF FOUND THEN
            d_rids := d_rids || p_request_ids[i];
            d_verdicts := d_verdicts || CASE
                WHEN v_prior.sku = p_sku AND v_prior.user_id = p_user_ids[i]
                    AND v_prior.qty = p_qtys[i] THEN 'C'
                ELSE 'R' END;
            d_orders := d_orders || v_prior.order_id::text;
            d_skus := d_skus || v_prior.sku;
            d_users := d_users || v_prior.user_id;
            d_qtys := d_qtys || v_prior.qty;
        ELSIF EXISTS (
            SELECT 1 FROM released_reservations rr
            WHERE rr.request_id = p_request_ids[i] AND rr.reserved_at_ms = p_reserved_at[i]
        ) THEN
            d_rids := d_rids || p_request_ids[i];
            d_verdicts := d_verdicts || 'X'::text;
            d_orders := d_orders || NULL::text;
            d_skus := d_skus || NULL::text;
            d_users := d_users || NULL::text;
            d_qtys := d_qtys || NULL::integer;
        ELSIF p_user_ids[i] = ANY (v_buyers) OR EXISTS (
            SELECT 1 FROM orders o WHERE o.sku = p_sku AND o.user_id = p_user_ids[i]
        ) THEN
            d_rids := d_rids || p_request_ids[i];
            d_verdicts := d_verdicts || 'D'::text;
            d_orders := d_orders || NULL::text;
            d_skus := d_skus || NULL::text;
            d_users := d_users || NULL::text;
            d_qtys := d_qtys || NULL::integer;
        ELSIF p_qtys[i] <= v_left THEN
            v_left := v_left - p_qtys[i];
            v_total := v_total + p_qtys[i];
            v_buyers := v_buyers || p_user_ids[i];
            g_rids := g_rids || p_request_ids[i];
            g_users := g_users || p_user_ids[i];
            g_qtys := g_qtys || p_qtys[i];
        ELSE
            d_rids := d_rids || p_request_ids[i];
            d_verdicts := d_verdicts || 'S'::text;
            d_orders := d_orders || NULL::text;
            d_skus := d_skus || NULL::text;
            d_users := d_users || NULL::text;
            d_qtys := d_qtys || NULL::integer;
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
        INSERT INTO orders AS o (request_id, sku, user_id, qty)
        SELECT r, p_sku, u, q FROM unnest(g_rids, g_users, g_qtys) AS t(r, u, q)
        RETURNING o.request_id, 'C'::text, o.order_id::text, o.sku, o.user_id, o.qty, v_stock;
    END IF;
    RETURN QUERY SELECT t.r, t.v, t.oid, t.s, t.u, t.q, v_stock
        FROM unnest(d_rids, d_verdicts, d_orders, d_skus, d_users, d_qtys)
        AS t(r, v, oid, s, u, q);
END
$$;
