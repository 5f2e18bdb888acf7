"""An order's life after its 201, in PostgreSQL: pay, cancel, expire.

PostgreSQL is the only arbiter. Each transition is one guarded ``UPDATE ...
WHERE status = 'pending_payment' AND pay_by > now()`` (pay, cancel) or
``<= now()`` (expire); ``now()`` is the transaction's start on the database's
one clock. Under read committed a second UPDATE of the row waits for the first
to commit and then checks its WHERE against the newest version, so exactly
one of pay, cancel and expire wins; zero rows means it lost, and the row read
afterwards says to whom.

A cancel or an expiry gives the units back in the same statement: the stock,
and a ``stock_movements`` row per order (reason ``cancelled``/``expired``). For
a sku whose strategy reserves in Redis the order is left with ``synced_at``
NULL: the units are owed to the Redis counter until
``lua/return_units.lua`` gave them back (:meth:`Lifecycle.mark_synced`); the
others have nothing in Redis, and are synced at once. Driver errors become
:class:`gateway.domain.errors.PostgresUnavailable` here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import asyncpg

from gateway.domain.errors import PaymentIdTaken
from gateway.domain.model import WINDOW_ELAPSED, Cause, Closed, Order, OrderStatus, Strategy
from gateway.domain.payments import BuyerOrder, LatePayment, LateStatus, OrderCursor, Paying
from gateway.postgres.database import Connection, as_unavailable
from gateway.postgres.orders import order_of

# Both of them reserve in Redis (gateway.domain.model.Strategy.reserves).
_RESERVING = "('reserve-batch', 'queue')"
ORDER_COLUMNS = "o.order_id::text, o.request_id, o.sku, o.user_id, o.qty, o.status, o.pay_by"

PAY = f"""
UPDATE orders o SET status = 'paid', payment_id = $2, closed_at = now(), synced_at = now(),
    cause = 'payment', reason = NULL
WHERE request_id = $1 AND status = 'pending_payment' AND pay_by > now()
RETURNING {ORDER_COLUMNS}, o.payment_id
"""
ORDER = f"SELECT {ORDER_COLUMNS}, o.payment_id FROM orders o WHERE request_id = $1"
# The order as a payment that did not pay it finds it, and the order its
# payment id is for already, if any (sql/013_payments.sql).
PAYING = f"""
SELECT {ORDER_COLUMNS}, o.payment_id,
    (SELECT p.request_id FROM payments p WHERE p.payment_id = $2) AS payment_for
FROM orders o WHERE request_id = $1
"""
# What a closed order's return puts back on sale: its units, but none for a
# refund without restock (its return only frees the buyer).
UNITS = "CASE WHEN o.restocked IS FALSE THEN 0 ELSE o.qty END"
# Every status whose return may be owed to Redis (implies orders_owed's predicate).
RETURNED = "('expired', 'cancelled', 'refunded')"
# $1 the orders; $2 the status they take: 'cancelled' (pending, before pay_by),
# 'expired' (pending, at or after it) or 'refunded' (paid or confirmed); $3 the
# gateway's strategy (a sku without its own sells under it); $4 the reason,
# $5 the cause (both for the event); $6 a refund's restock. The stock and the
# movements are written by the same statement as the transition; the
# movements' stock_after counts the orders of a sku one after another.
CLOSE = f"""
WITH closed AS (
    UPDATE orders o SET status = $2, closed_at = now(), reason = $4, cause = $5,
        restocked = CASE WHEN $2 = 'refunded' THEN $6::boolean END,
        synced_at = CASE WHEN COALESCE(i.strategy, $3) IN {_RESERVING} THEN NULL ELSE now() END
    FROM inventory i
    WHERE o.request_id = ANY($1::text[]) AND i.sku = o.sku
        AND CASE $2
            WHEN 'expired' THEN o.status = 'pending_payment' AND o.pay_by <= now()
            WHEN 'cancelled' THEN o.status = 'pending_payment' AND o.pay_by > now()
            ELSE o.status IN ('paid', 'confirmed') END
    RETURNING {ORDER_COLUMNS}, o.payment_id, o.synced_at IS NULL AS owed, {UNITS} AS units
), totals AS (
    SELECT sku, sum(units)::bigint AS total FROM closed GROUP BY sku HAVING sum(units) > 0
), back AS (
    UPDATE inventory i SET stock = i.stock + t.total, version = i.version + 1,
        updated_at = now()
    FROM totals t WHERE i.sku = t.sku
    RETURNING i.sku, i.stock
), moved AS (
    INSERT INTO stock_movements (sku, delta, reason, stock_after)
    SELECT c.sku, c.units, $2, b.stock - t.total
        + sum(c.units) OVER (PARTITION BY c.sku ORDER BY c.request_id)
    FROM closed c JOIN back b ON b.sku = c.sku JOIN totals t ON t.sku = c.sku
    WHERE c.units > 0
)
SELECT * FROM closed
"""
# Due orders, oldest deadline first; another gateway's sweep skips those it holds.
LOCK_DUE = """
SELECT request_id, sku FROM orders
WHERE status = 'pending_payment' AND pay_by <= now()
ORDER BY pay_by LIMIT $1 FOR UPDATE SKIP LOCKED
"""
# Two sweeps that hold orders of the same skus take their inventory rows in one
# order, so neither waits for the other's.
LOCK_SKUS = "SELECT 1 FROM inventory WHERE sku = ANY($1::text[]) ORDER BY sku FOR UPDATE"
# Returns a gateway committed and has not yet made in Redis (it crashed
# between the two, or Redis failed), closed at least $1 seconds ago.
OWED = f"""
SELECT {ORDER_COLUMNS}, {UNITS} AS units FROM orders o
WHERE status IN {RETURNED} AND synced_at IS NULL
    AND closed_at <= now() - make_interval(secs => $1)
ORDER BY closed_at LIMIT $2
"""
MARK_SYNCED = """
UPDATE orders SET synced_at = now() WHERE request_id = ANY($1::text[]) AND synced_at IS NULL
"""
NEXT_DEADLINE = """
SELECT EXTRACT(EPOCH FROM min(pay_by) - now())::float8 FROM orders
WHERE status = 'pending_payment'
"""
HELD = """
SELECT count(*), COALESCE(sum(qty), 0)::bigint FROM orders WHERE status = 'pending_payment'
"""
HELD_OF = """
SELECT COALESCE(sum(qty), 0)::bigint,
    COALESCE(EXTRACT(EPOCH FROM min(pay_by) - now()), 0)::float8
FROM orders WHERE sku = $1 AND status = 'pending_payment'
"""
# A late payment, recorded once, and its event (payment.late) as the order's
# next version: an event of the order, in its order, though its status stays.
RECORD_LATE = """
WITH late AS (
    INSERT INTO late_payments (payment_id, request_id, order_id, reason)
    VALUES ($1, $2, $3::uuid, $4) ON CONFLICT (payment_id) DO NOTHING
    RETURNING payment_id, request_id, reason
), bumped AS (
    UPDATE orders o SET version = o.version + 1 FROM late l WHERE o.request_id = l.request_id
    RETURNING o.order_id, o.version, o.request_id, o.sku, o.user_id, o.qty, o.status,
        l.payment_id, l.reason
)
INSERT INTO order_events (order_id, version, type, request_id, sku, user_id, qty, status,
    payment_id, reason, cause)
SELECT order_id, version, 'payment.late', request_id, sku, user_id, qty, status,
    payment_id, reason, 'payment'
FROM bumped
"""
LATE_COLUMNS = "seq, payment_id, request_id, order_id::text, reason, received_at, refunded_at"
# $1 the seq after which the page starts, $2 'owed', 'refunded' or 'all'.
LATE_PAYMENTS = f"""
SELECT {LATE_COLUMNS} FROM late_payments
WHERE seq > $1 AND ($2 = 'all' OR ($2 = 'owed') = (refunded_at IS NULL))
ORDER BY seq LIMIT $3
"""
LATE_PAYMENT = f"SELECT {LATE_COLUMNS} FROM late_payments WHERE payment_id = $1"
# A late payment marked refunded, once, with its event (payment.refunded).
REFUND_LATE = f"""
WITH refunded AS (
    UPDATE late_payments SET refunded_at = now() WHERE payment_id = $1 AND refunded_at IS NULL
    RETURNING {LATE_COLUMNS}
), bumped AS (
    UPDATE orders o SET version = o.version + 1 FROM refunded r WHERE o.request_id = r.request_id
    RETURNING o.order_id, o.version, o.request_id, o.sku, o.user_id, o.qty, o.status,
        r.payment_id, r.reason
), events AS (
    INSERT INTO order_events (order_id, version, type, request_id, sku, user_id, qty, status,
        payment_id, reason, cause)
    SELECT order_id, version, 'payment.refunded', request_id, sku, user_id, qty, status,
        payment_id, reason, 'payment'
    FROM bumped
)
SELECT * FROM refunded
"""
# A page of a buyer's orders, newest first, made before the cursor ($4, $5).
BUYER_ORDERS = f"""
SELECT {ORDER_COLUMNS}, o.payment_id, o.created_at FROM orders o
WHERE o.user_id = $1 AND ($2::text IS NULL OR o.sku = $2)
    AND ($3::text IS NULL OR o.status = $3) AND (o.created_at, o.order_id) < ($4, $5::uuid)
ORDER BY o.created_at DESC, o.order_id DESC LIMIT $6
"""
# Where the first page starts: before every order.
_NEWEST = OrderCursor(datetime.max.replace(tzinfo=UTC), "ffffffff-ffff-ffff-ffff-ffffffffffff")


class Lifecycle:
    """The guarded transitions of orders with a payment window."""

    def __init__(self, pool: asyncpg.Pool, default_strategy: Strategy) -> None:
        self._pool = pool
        self._default = default_strategy.value

    async def pay(self, request_id: str, payment_id: str) -> Paying | None:
        """Pay the order if it is pending and its deadline not reached: then the
        order, paid; else the order as it stands (None: no such order). Raises
        :class:`PaymentIdTaken` when ``payment_id`` is another order's."""
        with as_unavailable:
            try:
                row = await self._pool.fetchrow(PAY, request_id, payment_id)
            except asyncpg.UniqueViolationError:
                raise _taken(payment_id) from None
            if row is not None:
                return Paying(order_of(row), row["payment_id"], won=True)
            row = await self._pool.fetchrow(PAYING, request_id, payment_id)
        if row is None:
            return None
        taken = row["payment_for"] not in (None, request_id)
        return Paying(order_of(row), row["payment_id"], taken=taken)

    async def cancel(self, request_id: str, reason: str | None, cause: Cause) -> Closed | None:
        """Cancel the order if it is pending and its deadline not reached, with
        its units back on sale; None when it was not (it lost, or is unknown)."""
        closed = await self._close([request_id], OrderStatus.CANCELLED, reason, cause)
        return closed[0] if closed else None

    async def expire(self, request_id: str) -> Closed | None:
        """Expire the order if it is pending and its deadline reached."""
        closed = await self._close([request_id], OrderStatus.EXPIRED, WINDOW_ELAPSED, Cause.SWEEP)
        return closed[0] if closed else None

    async def refund(
        self, request_id: str, *, restock: bool, reason: str | None, cause: Cause
    ) -> Closed | None:
        """Refund the order if it is paid or confirmed; with ``restock`` its units
        go back on sale as a cancel's do. None when it was not refundable."""
        closed = await self._close(
            [request_id], OrderStatus.REFUNDED, reason, cause, restock=restock
        )
        return closed[0] if closed else None

    async def _close(
        self,
        request_ids: Sequence[str],
        status: OrderStatus,
        reason: str | None,
        cause: Cause,
        *,
        restock: bool = True,
    ) -> list[Closed]:
        with as_unavailable:
            async with self._pool.acquire() as con, con.transaction():
                return await _closed(
                    con, request_ids, status, self._default, reason, cause, restock=restock
                )

    async def expire_due(self, limit: int) -> list[Closed]:
        """Expire up to ``limit`` orders whose deadline passed, in one transaction;
        those another sweep holds are skipped."""
        with as_unavailable:
            async with self._pool.acquire() as con, con.transaction():
                due = await con.fetch(LOCK_DUE, limit)
                if not due:
                    return []
                await con.execute(LOCK_SKUS, sorted({r["sku"] for r in due}))
                rids = [r["request_id"] for r in due]
                expired, sweep = OrderStatus.EXPIRED, Cause.SWEEP
                return await _closed(
                    con, rids, expired, self._default, WINDOW_ELAPSED, sweep, restock=True
                )

    async def owed(self, older_than_s: float, limit: int) -> list[Closed]:
        """Closed orders whose return was not yet given to Redis."""
        with as_unavailable:
            rows = await self._pool.fetch(OWED, older_than_s, limit)
        return [Closed(order_of(r), owed=True, units=r["units"]) for r in rows]

    async def mark_synced(self, request_ids: Sequence[str]) -> None:
        """Record that Redis got these orders' units back."""
        with as_unavailable:
            await self._pool.execute(MARK_SYNCED, list(request_ids))

    async def next_deadline_s(self) -> float | None:
        """Seconds until the earliest pending deadline (negative: due), if any."""
        with as_unavailable:
            value: float | None = await self._pool.fetchval(NEXT_DEADLINE)
        return value

    async def held(self) -> tuple[int, int]:
        """Orders pending payment, and the units they hold."""
        with as_unavailable:
            row = await self._pool.fetchrow(HELD)
        assert row is not None  # an aggregate without GROUP BY answers one row
        return row[0], row[1]

    async def held_of(self, sku: str) -> tuple[int, float]:
        """Units held for payment of ``sku``, and seconds to the earliest deadline."""
        with as_unavailable:
            row = await self._pool.fetchrow(HELD_OF, sku)
        assert row is not None  # an aggregate without GROUP BY answers one row
        return row[0], row[1]

    async def order(self, request_id: str) -> Paying | None:
        """The order of ``request_id`` as it stands, and its payment id."""
        with as_unavailable:
            row = await self._pool.fetchrow(ORDER, request_id)
        return None if row is None else Paying(order_of(row), row["payment_id"])

    async def record_late(self, payment_id: str, order: Order) -> bool:
        """Record a payment that came after its order closed, for a refund, with
        its event; whether it was recorded now (not before). Raises
        :class:`PaymentIdTaken` when ``payment_id`` is another order's."""
        with as_unavailable:
            try:
                done = await self._pool.execute(
                    RECORD_LATE, payment_id, order.request_id, order.order_id, order.status
                )
            except asyncpg.UniqueViolationError:
                raise _taken(payment_id) from None
        return done != "INSERT 0 0"

    async def late_payments(self, status: LateStatus, after: int, limit: int) -> list[LatePayment]:
        """A page of the late payments of ``status``, oldest first, after ``after``."""
        with as_unavailable:
            rows = await self._pool.fetch(LATE_PAYMENTS, after, status.value, limit)
        return [_late(r) for r in rows]

    async def refund_late(self, payment_id: str) -> tuple[LatePayment, bool] | None:
        """Mark a late payment refunded: it, and whether it was marked now (False:
        it was already); None for an unknown payment id."""
        with as_unavailable:
            row = await self._pool.fetchrow(REFUND_LATE, payment_id)
            if row is not None:
                return _late(row), True
            row = await self._pool.fetchrow(LATE_PAYMENT, payment_id)
        return None if row is None else (_late(row), False)

    async def buyer_orders(
        self,
        user_id: str,
        *,
        sku: str | None,
        status: OrderStatus | None,
        before: OrderCursor | None,
        limit: int,
    ) -> list[BuyerOrder]:
        """A page of ``user_id``'s orders, newest first, made before ``before``."""
        start = before or _NEWEST
        with as_unavailable:
            rows = await self._pool.fetch(
                BUYER_ORDERS, user_id, sku, status, start.created_at, start.order_id, limit
            )
        return [BuyerOrder(order_of(r), r["payment_id"], r["created_at"]) for r in rows]


def _late(row: asyncpg.Record) -> LatePayment:
    return LatePayment(
        row["seq"],
        row["payment_id"],
        row["request_id"],
        row["order_id"],
        row["reason"],
        row["received_at"],
        row["refunded_at"],
    )


def _taken(payment_id: str) -> PaymentIdTaken:
    # payments' primary key refused the claim (sql/013_payments.sql's trigger).
    return PaymentIdTaken(f"payment {payment_id!r} is another order's")


async def _closed(
    con: Connection,
    request_ids: Sequence[str],
    status: OrderStatus,
    default: str,
    reason: str | None,
    cause: Cause,
    *,
    restock: bool,
) -> list[Closed]:
    rows = await con.fetch(
        CLOSE, list(request_ids), status.value, default, reason, cause.value, restock
    )
    return [
        Closed(order_of(r), owed=r["owed"], units=r["units"], payment_id=r["payment_id"])
        for r in rows
    ]
