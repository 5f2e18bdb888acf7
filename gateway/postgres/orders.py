"""Orders in PostgreSQL: the flush that makes them, its arbitration with the
reconciler, and the reads of orders and database stock.

The flush itself is the ``flush_batch`` function of
``sql/functions/flush_batch.sql``, so a flush costs one round trip; what it
decided comes back as a :class:`BatchDecision`. Every statement that takes
stock carries its ``stock >=`` guard (``tests/unit/test_sql_guard.py`` scans
for it), so the database refuses an oversell whatever Redis or a lock said.

Beside it: the inventory rows and their admin changes
(``gateway.postgres.inventory``), the sale gate's window and rate buckets
(``gateway.postgres.sale_gate``) and the database's identity
(``gateway.postgres.identity``).

Driver errors become :class:`gateway.domain.errors.PostgresUnavailable` here
(``gateway.postgres.database.as_unavailable``), and the flush's own SQLSTATEs
its typed errors.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from gateway.domain.errors import (
    FencedOut,
    GatewayError,
    GroupGuardRefused,
    GroupLimitReached,
    IdempotencyMismatch,
    OutcomeUnknown,
    StockGuardRefused,
    Unavailable,
)
from gateway.domain.events import FirstEvents
from gateway.domain.model import (
    DUPLICATE,
    SOLD_OUT,
    Order,
    Outcome,
    Purchase,
    Result,
    Verdict,
)
from gateway.domain.rules import rfc3339
from gateway.domain.stock import OrderPage
from gateway.postgres.database import DB_ERRORS, as_unavailable, cause

# Serializes writers of one sku (admin changes lock the row too).
LOCK_INVENTORY_ROW = "SELECT stock, fence FROM inventory WHERE sku = $1 FOR UPDATE"
# A whole flush in one round trip: see sql/functions/flush_batch.sql, whose UPDATE
# carries the stock >= guard and the fencing check.
# With $7 (a sink's name) and $8 (the flush's token), the new orders' first
# events are this gateway's to hand to that sink (sql/032_event_handoff.sql).
FLUSH_BATCH = """
SELECT * FROM flush_batch($1, $2::text[], $3::text[], $4::int[], $5::bigint[], $6::bigint, 2,
    $7::text, $8::bigint)
"""
# The reconciler's side of the same arbitration: under the row lock, stale
# reservations without an order are recorded as released, so a flush still on
# its way answers them "X" instead of committing them after their stock went back.
RECORD_RELEASED = """
INSERT INTO released_reservations (request_id, reserved_at_ms)
SELECT * FROM unnest($1::text[], $2::bigint[]) ON CONFLICT DO NOTHING
"""
# The stock Redis should count: units of closed orders not yet returned to
# it are owed (gateway.postgres.lifecycle), and return_units.lua adds them
# when it returns them, so a counter loaded meanwhile must not count them yet.
SKU_STOCK = """
SELECT stock - COALESCE((
    SELECT sum(CASE WHEN restocked IS FALSE THEN 0 ELSE qty END) FROM orders
    WHERE sku = $1 AND status IN ('expired', 'cancelled', 'refunded') AND synced_at IS NULL), 0)
FROM inventory WHERE sku = $1
"""
# The inventory's stock and, from the same snapshot, the returns SKU_STOCK
# leaves out as owed (a row of NULLs when none is).
STOCK_AND_OWED = """
SELECT i.stock, o.request_id, CASE WHEN o.restocked IS FALSE THEN 0 ELSE o.qty END AS qty
FROM inventory i
LEFT JOIN orders o ON o.sku = i.sku AND o.status IN ('expired', 'cancelled', 'refunded')
    AND o.synced_at IS NULL
WHERE i.sku = $1
"""
ORDERS_BY_REQUESTS = """
SELECT order_id::text, request_id, sku, user_id, qty, status, pay_by FROM orders
WHERE request_id = ANY($1::text[])
"""
# A request id's order only for its own buyer: another buyer's reads as none.
ORDER_OF_BUYER = """
SELECT order_id::text, request_id, sku, user_id, qty, status, pay_by FROM orders
WHERE request_id = $1 AND user_id = $2
"""
# While a sku's Redis hashes are rebuilt, for the new purchases of one sku: the
# orders of their request ids, and their buyers' orders of the sku (two unique
# indexes; at most two rows a purchase). gateway.strategies.rows asks the same
# of one purchase inside its transaction (ORDERS_BY_REQUEST_OR_BUYER).
ORDERS_BY_REQUESTS_OR_BUYERS = """
SELECT order_id::text, request_id, sku, user_id, qty, status, pay_by FROM orders
WHERE request_id = ANY($1::text[])
    OR (sku = $2 AND user_id = ANY($3::text[])
        AND status IN ('confirmed', 'pending_payment', 'paid'))
"""
# One page of a sku's live orders for a rebuild, in the unique (sku, user_id)
# index's order after the last buyer of the page before (an expired or cancelled
# order names no buyer any more: its buyer may buy again), as one text: per order its
# request id, the done-hash record of gateway.redis.layout.encode_confirmed and its
# buyer, every field followed by a tab (ids never hold one, gateway.http.payloads);
# then the page's last buyer and its count of orders. One value to decode
# instead of a row per order: the gateway's work per page is one split.
ORDER_PAGE = """
SELECT string_agg(
    request_id || E'\\t' || order_id::text || '|' || user_id || '|' || qty::text || E'\\t'
    || user_id || E'\\t', '' ORDER BY user_id), max(user_id), count(*)
FROM (SELECT request_id, order_id, user_id, qty FROM orders
      WHERE sku = $1 AND user_id > $2 AND status IN ('confirmed', 'pending_payment', 'paid')
      ORDER BY user_id LIMIT $3) AS page
"""
UNITS_SOLD = """
SELECT COALESCE(SUM(qty), 0) FROM orders
WHERE sku = $1 AND status IN ('confirmed', 'pending_payment', 'paid')
"""


# What a flush decided (flush_batch's rows), and the SQLSTATEs that refuse a batch.

# The SQLSTATEs flush_batch raises, each for one cause; nothing is written.
FLUSH_ERRORS: dict[str, type[Unavailable]] = {
    "FS001": FencedOut,  # a fencing token older than the row's
    "FS002": StockGuardRefused,  # the stock >= guard refused the batch
    "FS003": GroupGuardRefused,  # a buyer would pass their limit group's limit
}


@dataclass(frozen=True, slots=True)
class Decision:
    """The database's verdict on one purchase of a batch."""

    result: Result | GatewayError
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """What one committed flush decided, by request id."""

    decisions: dict[str, Decision]
    # Database stock after the batch when it found too little stock, else None.
    short_stock_after: int | None
    # The new orders whose first events this gateway hands off; None: none,
    # or no hand-off was asked for.
    handed: FirstEvents | None = None


# A verdict's letter as its member: a dict lookup, not Verdict(letter), whose
# EnumType.__call__ cost 0.65 µs an order of every flush.
_VERDICTS = {member.value: member for member in Verdict}


def _decision_of(row: asyncpg.Record) -> Decision:
    """One row of ``flush_batch`` as the decision on its purchase."""
    verdict = _VERDICTS[row["verdict"]]
    if verdict is Verdict.RELEASED:
        # The request id holds another purchase's order: never answered with it.
        return Decision(IdempotencyMismatch(row["request_id"]), verdict)
    if verdict is Verdict.CONFIRMED:
        order = _flushed_order(row)
        return Decision(Result(Outcome.CONFIRMED, order.as_first_answered()), verdict)
    if verdict is Verdict.EXPIRED:
        # Already released by the reconciler: nothing to settle but the answer.
        return Decision(Unavailable("reservation expired; retry"), verdict)
    if verdict is Verdict.GROUP_LIMIT:
        # The row names the group in order_status (sql/functions/flush_batch.sql).
        return Decision(GroupLimitReached(row["order_status"]), verdict)
    return Decision(DUPLICATE if verdict is Verdict.DUPLICATE else SOLD_OUT, verdict)


def _new_order(decisions: dict[str, Decision], row: asyncpg.Record) -> Order:
    """The order a ``flush_batch`` row of a new order was decided with."""
    result = decisions[row["request_id"]].result
    assert isinstance(result, Result) and result.order is not None
    return result.order


def _flushed_order(row: asyncpg.Record) -> Order:
    """A ``flush_batch`` row of an order (C or R) as the order."""
    return Order(
        row["order_id"],
        row["request_id"],
        row["order_sku"],
        row["order_user"],
        row["order_qty"],
        row["order_status"],
        pay_by_text(row["order_pay_by"]),
    )


def pay_by_text(pay_by: datetime | None) -> str | None:
    """An order's deadline as the API shows it."""
    return None if pay_by is None else rfc3339(pay_by)


def order_of(row: asyncpg.Record) -> Order:
    """An order row (its order_id as text, status and pay_by) as an :class:`Order`."""
    return Order(
        row["order_id"],
        row["request_id"],
        row["sku"],
        row["user_id"],
        row["qty"],
        row["status"],
        pay_by_text(row["pay_by"]),
    )


# What breaks a connection with the flush's statement sent: it may have committed.
_BROKEN_MID_STATEMENT = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    OSError,
    TimeoutError,
    asyncpg.InternalClientError,
)


class Orders:
    """The flush's commits, and reads of orders and database stock."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def commit_batch(
        self, sku: str, batch: Sequence[Purchase], fence: int | None, handoff: str | None = None
    ) -> BatchDecision:
        """Decide a batch, insert its orders and take their stock: one statement.

        With ``handoff`` (a sink's name), the new orders' first events are the
        caller's to hand to that sink: they come back as the decision's
        ``handed``, and the outbox waits for word that they landed.

        Raises :class:`FencedOut` when ``fence`` is older than the row's and
        :class:`Unavailable` when PostgreSQL refused or could not be reached;
        then nothing committed. Raises :class:`OutcomeUnknown` when the
        connection broke after the statement was sent: it may have committed.
        """
        # Names this flush's batch row in the outbox while the hand-off runs.
        token = None if handoff is None else secrets.randbits(63)
        args = (
            sku,
            [p.request_id for p in batch],
            [p.user_id for p in batch],
            [p.qty for p in batch],
            [p.reserved_at_ms for p in batch],
            fence,
            handoff,
            token,
        )
        with as_unavailable:
            async with self.pool.acquire() as con:
                try:
                    rows = await con.fetch(FLUSH_BATCH, *args)
                except _BROKEN_MID_STATEMENT as exc:
                    raise OutcomeUnknown(cause(exc)) from exc
                except asyncpg.PostgresError as exc:
                    refused = FLUSH_ERRORS.get(exc.sqlstate)
                    if refused is None:
                        raise
                    raise refused(cause(exc)) from exc
        decisions = {row["request_id"]: _decision_of(row) for row in rows}
        short = any(d.verdict is Verdict.SOLD_OUT for d in decisions.values())
        stock_after = rows[0]["stock_after"] if rows else None
        handed = None
        if token is not None:
            fresh = [row for row in rows if row["order_fresh"]]
            # One new order's row alone carries when (flush_batch.sql). Nothing
            # here may raise: the batch is committed.
            occurred = next((row["occurred"] for row in fresh if row["occurred"]), None)
            if occurred is not None:
                orders = [_new_order(decisions, row) for row in fresh]
                handed = FirstEvents(token, rfc3339(occurred), orders)
        return BatchDecision(decisions, stock_after if short else None, handed)

    async def release_stale(self, sku: str, stale: Sequence[tuple[str, int]]) -> dict[str, Order]:
        """Arbitrate stale reservations ``(request_id, reserved_at_ms)`` with flushes.

        Under the inventory row lock, which every flush takes first: those with an
        order are returned (they committed); the others are recorded as released,
        so no flush can commit them any more.
        """
        rids = [rid for rid, _ in stale]
        with as_unavailable:
            async with self.pool.acquire() as con, con.transaction():
                await con.execute(LOCK_INVENTORY_ROW, sku)
                found = {
                    r["request_id"]: order_of(r) for r in await con.fetch(ORDERS_BY_REQUESTS, rids)
                }
                gone = [(rid, at) for rid, at in stale if rid not in found]
                if gone:
                    await con.execute(RECORD_RELEASED, [r for r, _ in gone], [a for _, a in gone])
                return found

    async def stock(self, sku: str) -> int | None:
        """Database stock of a sku, or None when it does not exist."""
        with as_unavailable:
            value: int | None = await self.pool.fetchval(SKU_STOCK, sku)
        return value

    async def stock_and_owed(self, sku: str) -> tuple[int, dict[str, int]] | None:
        """The sku's stock counting every return, and the returns not yet recorded
        as given to Redis (request id -> units), read at one moment: :meth:`stock`
        is the first less the second. None for an unknown sku."""
        with as_unavailable:
            rows = await self.pool.fetch(STOCK_AND_OWED, sku)
        if not rows:
            return None
        owed = {r["request_id"]: r["qty"] for r in rows if r["request_id"] is not None}
        return rows[0]["stock"], owed

    async def units_sold(self, sku: str) -> int:
        """Units in committed orders of a sku."""
        with as_unavailable:
            value: int = await self.pool.fetchval(UNITS_SOLD, sku)
        return value

    async def order(self, request_id: str) -> Order | None:
        """The order made by a request id, if any."""
        found = await self.orders([request_id])
        return found.get(request_id)

    async def buyers_order(self, request_id: str, user_id: str) -> Order | None:
        """The order made by a request id, if ``user_id`` is its buyer."""
        with as_unavailable:
            row = await self.pool.fetchrow(ORDER_OF_BUYER, request_id, user_id)
        return None if row is None else order_of(row)

    async def orders(self, request_ids: Sequence[str]) -> dict[str, Order]:
        """The orders made by these request ids, by request id."""
        with as_unavailable:
            rows = await self.pool.fetch(ORDERS_BY_REQUESTS, list(request_ids))
        return {r["request_id"]: order_of(r) for r in rows}

    async def priors(
        self, sku: str, request_ids: Sequence[str], user_ids: Sequence[str]
    ) -> tuple[dict[str, Order], set[str]]:
        """The orders these request ids made (of any sku), by request id, and
        which of these users bought ``sku``."""
        with as_unavailable:
            rows = await self.pool.fetch(
                ORDERS_BY_REQUESTS_OR_BUYERS, list(request_ids), sku, list(user_ids)
            )
        found = [order_of(r) for r in rows]
        wanted = set(request_ids)
        made = {o.request_id: o for o in found if o.request_id in wanted}
        return made, {o.user_id for o in found if o.sku == sku}

    async def order_page(self, sku: str, after_user: str, limit: int) -> OrderPage:
        """Up to ``limit`` orders of ``sku`` whose buyer sorts after ``after_user``,
        in buyer order: ``request_id, done record, user_id`` of each, flat."""
        with as_unavailable:
            rows = await self.pool.fetch(ORDER_PAGE, sku, after_user, limit)
        text, last_user, count = rows[0]
        fields = text.split("\t")[:-1] if text else []
        return OrderPage(fields, last_user or after_user, count)

    async def ping(self) -> bool:
        """Whether PostgreSQL answers."""
        try:
            return bool(await self.pool.fetchval("SELECT 1", timeout=2))
        except DB_ERRORS:
            return False
