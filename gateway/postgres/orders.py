"""The PostgreSQL adapter: inventory rows, orders and stock movements.

Every statement is a named constant of :mod:`gateway.postgres.statements`, or, for the
flush, the ``flush_batch`` function of ``sql/functions/flush_batch.sql``, so a
flush costs one round trip.
Driver errors become :class:`gateway.domain.errors.PostgresUnavailable` here, and the
flush's own SQLSTATEs its typed errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import asyncpg

from gateway.domain.errors import (
    InvalidRequest,
    OutcomeUnknown,
    PostgresUnavailable,
)
from gateway.domain.model import (
    Order,
    Purchase,
    SkuInfo,
    SkuSettings,
    Verdict,
)
from gateway.postgres.decisions import FLUSH_ERRORS, BatchDecision, decision_of
from gateway.postgres.skurows import settings_of, write_settings
from gateway.postgres.statements import (
    ALL_SKUS,
    CREATE_SKU,
    DATABASE_IDENTITY,
    DATABASE_OID,
    FLUSH_BATCH,
    LOCK_INVENTORY_ROW,
    LOCK_SKU_SETTINGS,
    ORDER_PAGE,
    ORDERS_BY_REQUESTS,
    PRIOR_ORDERS,
    PRUNE_RATE_BUCKETS,
    RECORD_MOVEMENT,
    RECORD_RELEASED,
    RESTOCK,
    SALE_GATE,
    SKU_INFO,
    SKU_STOCK,
    UNITS_SOLD,
    WAITING_ROOM_SKUS,
)

DB_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # Raised by the driver when a broken connection is reused mid-protocol.
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


@dataclass(frozen=True, slots=True)
class OrderPage:
    """One page of a sku's orders in buyer order: the fields asked for, flat;
    the page's last buyer (where the next page starts) and its count of orders."""

    fields: list[str]
    last_user: str
    count: int


# A rate-limit bucket as sale_gate() takes it: its name ('u:<user>' or
# 'c:<address>'), tokens a second and burst.
Bucket = tuple[str, float, int]
_NO_BUCKET: Bucket = ("", 0.0, 0)


def _cause(exc: BaseException) -> str:
    return f"postgres: {type(exc).__name__}"


def _order(row: asyncpg.Record) -> Order:
    return Order(row["order_id"], row["request_id"], row["sku"], row["user_id"], row["qty"])


class Orders:
    """Reads and writes of inventory rows and orders."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def commit_batch(
        self, sku: str, batch: Sequence[Purchase], fence: int | None
    ) -> BatchDecision:
        """Decide a batch, insert its orders and take their stock: one statement.

        Raises :class:`FencedOut` when ``fence`` is older than the row's and
        :class:`Unavailable` when PostgreSQL refused or could not be reached;
        then nothing committed. Raises :class:`OutcomeUnknown` when the
        connection broke after the statement was sent: it may have committed.
        """
        args = (
            sku,
            [p.request_id for p in batch],
            [p.user_id for p in batch],
            [p.qty for p in batch],
            [p.reserved_at_ms for p in batch],
            fence,
        )
        try:
            async with self.pool.acquire() as con:
                try:
                    rows = await con.fetch(FLUSH_BATCH, *args)
                except (
                    asyncpg.PostgresConnectionError,
                    asyncpg.InterfaceError,
                    OSError,
                    TimeoutError,
                    asyncpg.InternalClientError,
                ) as exc:
                    raise OutcomeUnknown(_cause(exc)) from exc
        except asyncpg.PostgresError as exc:
            raise FLUSH_ERRORS.get(exc.sqlstate, PostgresUnavailable)(_cause(exc)) from exc
        except DB_ERRORS as exc:
            raise PostgresUnavailable(_cause(exc)) from exc
        decisions = {row["request_id"]: decision_of(row) for row in rows}
        short = any(d.verdict is Verdict.SOLD_OUT for d in decisions.values())
        stock_after = rows[0]["stock_after"] if rows else None
        return BatchDecision(decisions, stock_after if short else None)

    async def release_stale(self, sku: str, stale: Sequence[tuple[str, int]]) -> dict[str, Order]:
        """Arbitrate stale reservations ``(request_id, reserved_at_ms)`` with flushes.

        Under the inventory row lock, which every flush takes first: those with an
        order are returned (they committed); the others are recorded as released,
        so no flush can commit them any more.
        """
        rids = [rid for rid, _ in stale]
        try:
            async with self.pool.acquire() as con, con.transaction():
                await con.execute(LOCK_INVENTORY_ROW, sku)
                found = {
                    r["request_id"]: _order(r) for r in await con.fetch(ORDERS_BY_REQUESTS, rids)
                }
                gone = [(rid, at) for rid, at in stale if rid not in found]
                if gone:
                    await con.execute(RECORD_RELEASED, [r for r, _ in gone], [a for _, a in gone])
                return found
        except DB_ERRORS as exc:
            raise PostgresUnavailable(_cause(exc)) from exc

    async def identity(self) -> str:
        """The identity of the database (see DATABASE_IDENTITY)."""
        try:
            value: str = await self.pool.fetchval(DATABASE_IDENTITY)
        except asyncpg.InsufficientPrivilegeError:
            value = await self._fetchval(DATABASE_OID)
        except DB_ERRORS as exc:
            raise PostgresUnavailable(_cause(exc)) from exc
        return value

    async def sku_info(self, sku: str) -> SkuInfo | None:
        """The sku's per-user limit, sale rules, waiting room and strategy, or None
        when it does not exist."""
        try:
            row = await self.pool.fetchrow(SKU_INFO, sku)
        except DB_ERRORS as exc:
            raise PostgresUnavailable(_cause(exc)) from exc
        return None if row is None else settings_of(row).info(sku)

    async def stock(self, sku: str) -> int | None:
        """Database stock of a sku, or None when it does not exist."""
        value: int | None = await self._fetchval(SKU_STOCK, sku)
        return value

    async def skus(self) -> list[str]:
        """Every sku in the inventory."""
        try:
            return [r["sku"] for r in await self.pool.fetch(ALL_SKUS)]
        except DB_ERRORS as exc:
            raise PostgresUnavailable(_cause(exc)) from exc

    async def waiting_room_skus(self, limit: int) -> list[str]:
        """The first ``limit`` skus (by name) that have a waiting room."""
        try:
            return [r["sku"] for r in await self.pool.fetch(WAITING_ROOM_SKUS, limit)]
        except DB_ERRORS as exc:
            raise PostgresUnavailable(_cause(exc)) from exc

    async def units_sold(self, sku: str) -> int:
        """Units in committed orders of a sku."""
        value: int = await self._fetchval(UNITS_SOLD, sku)
        return value

    async def order(self, request_id: str) -> Order | None:
        """The order made by a request id, if any."""
        found = await self.orders([request_id])
        return found.get(request_id)

    async def orders(self, request_ids: Sequence[str]) -> dict[str, Order]:
        """The orders made by these request ids, by request id."""
        try:
            rows = await self.pool.fetch(ORDERS_BY_REQUESTS, list(request_ids))
        except DB_ERRORS as exc:
            raise PostgresUnavailable(_cause(exc)) from exc
        return {r["request_id"]: _order(r) for r in rows}

    async def prior(self, sku: str, request_id: str, user_id: str) -> tuple[Order | None, bool]:
        """The order ``request_id`` made, if any, and whether ``user_id`` bought ``sku``."""
        found = [_order(r) for r in await self._fetch(PRIOR_ORDERS, request_id, sku, user_id)]
        made = next((o for o in found if o.request_id == request_id), None)
        return made, any(o.sku == sku and o.user_id == user_id for o in found)

    async def order_page(self, sku: str, after_user: str, limit: int) -> OrderPage:
        """Up to ``limit`` orders of ``sku`` whose buyer sorts after ``after_user``,
        in buyer order: ``request_id, done record, user_id`` of each, flat."""
        rows = await self._fetch(ORDER_PAGE, sku, after_user, limit)
        text, last_user, count = rows[0]
        fields = text.split("\t")[:-1] if text else []
        return OrderPage(fields, last_user or after_user, count)

    async def change_sku(
        self, sku: str, fields: Mapping[str, Any], *, create: bool
    ) -> tuple[SkuSettings | None, SkuSettings] | None:
        """Set ``fields`` (:class:`SkuSettings` attributes) on ``sku`` under its row
        lock, the others kept, recording a stock movement when ``stock`` is one
        of them; with ``create`` a missing sku is created first. Returns (before,
        after), before None for a sku created now; None for a missing sku
        without ``create``. Raises :class:`InvalidRequest` when the window that
        results ends before it starts (nothing is written)."""
        try:
            async with self.pool.acquire() as con, con.transaction():
                created = create and await con.fetchval(CREATE_SKU, sku) is not None
                row = await con.fetchrow(LOCK_SKU_SETTINGS, sku)
                if row is None:
                    return None
                before = settings_of(row)
                after = replace(before, **fields)
                if after.starts_at and after.ends_at and after.ends_at <= after.starts_at:
                    raise InvalidRequest("ends_at must be after starts_at")
                await write_settings(con, sku, after)
                if "stock" in fields:
                    delta = after.stock - before.stock
                    await con.execute(RECORD_MOVEMENT, sku, delta, "set", after.stock)
                return (None if created else before), after
        except DB_ERRORS as exc:
            raise PostgresUnavailable(_cause(exc)) from exc

    async def restock(self, sku: str, delta: int) -> int | None:
        """Add stock, recording the movement; returns the new stock, None if no sku."""
        try:
            async with self.pool.acquire() as con, con.transaction():
                after: int | None = await con.fetchval(RESTOCK, sku, delta)
                if after is not None:
                    await con.execute(RECORD_MOVEMENT, sku, delta, "restock", after)
                return after
        except DB_ERRORS as exc:
            raise PostgresUnavailable(_cause(exc)) from exc

    async def sale_gate(
        self, purchase: Purchase, user: Bucket | None, client: Bucket | None
    ) -> tuple[str, int]:
        """The sale window and the token buckets of ``purchase`` by PostgreSQL's
        clock (``sale_gate()``): (verdict, wait_ms), the verdict one of ``pass``,
        ``not_started``, ``ended``, ``rate_limited``."""
        p, u, c = purchase, user or _NO_BUCKET, client or _NO_BUCKET
        args = (p.sku, p.request_id, p.qty, u[0], u[1], u[2], c[0], c[1], c[2])
        try:
            row = await self.pool.fetchrow(SALE_GATE, *args)
        except DB_ERRORS as exc:
            raise PostgresUnavailable(_cause(exc)) from exc
        assert row is not None  # a function call returns its one row
        return row["verdict"], row["wait_ms"]

    async def prune_rate_buckets(self) -> int:
        """Delete the rate-limit buckets that are full again; how many."""
        try:
            done = await self.pool.execute(PRUNE_RATE_BUCKETS)
        except DB_ERRORS as exc:
            raise PostgresUnavailable(_cause(exc)) from exc
        return int(done.split()[-1])

    async def ping(self) -> bool:
        """Whether PostgreSQL answers."""
        try:
            return bool(await self.pool.fetchval("SELECT 1", timeout=2))
        except DB_ERRORS:
            return False

    async def _fetch(self, sql: str, *args: object) -> list[asyncpg.Record]:
        try:
            return await self.pool.fetch(sql, *args)
        except DB_ERRORS as exc:
            raise PostgresUnavailable(_cause(exc)) from exc

    async def _fetchval(self, sql: str, *args: object) -> Any:
        try:
            return await self.pool.fetchval(sql, *args)
        except DB_ERRORS as exc:
            raise PostgresUnavailable(_cause(exc)) from exc
