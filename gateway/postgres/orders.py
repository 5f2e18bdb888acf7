"""The PostgreSQL adapter: inventory rows, orders, stock movements, and the flush.

Its SQL is here, each statement a named constant next to the one class that
runs it. The flush itself is the ``flush_batch`` function of
``sql/functions/flush_batch.sql``, so a flush costs one round trip; what it
decided comes back as a :class:`BatchDecision`. Every statement that takes
stock carries its ``stock >=`` guard (``tests/unit/test_sql_guard.py`` scans
for it), so the database refuses an oversell whatever Redis or a lock said.

Driver errors become :class:`gateway.domain.errors.PostgresUnavailable` here,
and the flush's own SQLSTATEs its typed errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import asyncpg

from gateway.domain.errors import (
    FencedOut,
    GatewayError,
    IdempotencyMismatch,
    InvalidRequest,
    OutcomeUnknown,
    PostgresUnavailable,
    StockGuardRefused,
    Unavailable,
)
from gateway.domain.model import (
    DUPLICATE,
    SOLD_OUT,
    Order,
    Outcome,
    Purchase,
    Result,
    SkuInfo,
    SkuSettings,
    Strategy,
    Verdict,
    WaitingRoom,
)
from gateway.domain.rules import Rate, rate_from_db
from gateway.postgres.database import DB_ERRORS, Connection

# Serializes writers of one sku (admin changes lock the row too).
LOCK_INVENTORY_ROW = "SELECT stock, fence FROM inventory WHERE sku = $1 FOR UPDATE"
# A whole flush in one round trip: see sql/functions/flush_batch.sql, whose UPDATE
# carries the stock >= guard and the fencing check.
FLUSH_BATCH = """
SELECT * FROM flush_batch($1, $2::text[], $3::text[], $4::int[], $5::bigint[], $6::bigint)
"""
# The reconciler's side of the same arbitration: under the row lock, stale
# reservations without an order are recorded as released, so a flush still on
# its way answers them "X" instead of committing them after their stock went back.
RECORD_RELEASED = """
INSERT INTO released_reservations (request_id, reserved_at_ms)
SELECT * FROM unnest($1::text[], $2::bigint[]) ON CONFLICT DO NOTHING
"""
# Which database this is: the cluster's system identifier, the database's oid
# and the WAL timeline (the first 8 hex digits of the current WAL file's name).
# A database restored from a dump into a new database, or another cluster,
# differs in the first two; a standby promoted by a failover, or a point-in-time
# recovery, shares them with its origin but starts a new timeline.
DATABASE_IDENTITY = """
SELECT (SELECT system_identifier FROM pg_control_system())::text || ':'
    || (SELECT oid FROM pg_database WHERE datname = current_database())::text || ':'
    || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)
"""
# Where pg_control_system() is not granted (some managed services): the oid alone.
DATABASE_OID = """
SELECT '?:' || (SELECT oid FROM pg_database WHERE datname = current_database())::text
"""
SKU_INFO = """
SELECT stock, per_user_limit, room_admit_per_s, room_token_ttl_s, room_shuffle_at_start,
       starts_at, ends_at, user_rate, client_rate, strategy
FROM inventory WHERE sku = $1
"""
# The same, with the row locked for an admin change (admin changes and flushes
# of the sku queue on it).
LOCK_SKU_SETTINGS = SKU_INFO.rstrip() + " FOR UPDATE\n"
SKU_STOCK = "SELECT stock FROM inventory WHERE sku = $1"
ALL_SKUS = "SELECT sku FROM inventory ORDER BY sku"
# Skus sold through a waiting room (gateway.usecases.servable: they need an admission secret).
WAITING_ROOM_SKUS = """
SELECT sku FROM inventory WHERE room_admit_per_s IS NOT NULL ORDER BY sku LIMIT $1
"""
ORDERS_BY_REQUESTS = """
SELECT order_id::text, request_id, sku, user_id, qty FROM orders
WHERE request_id = ANY($1::text[])
"""
# While a sku's Redis hashes are rebuilt, for the new purchases of one sku: the
# orders of their request ids, and their buyers' orders of the sku (two unique
# indexes; at most two rows a purchase).
PRIOR_ORDERS = """
SELECT order_id::text, request_id, sku, user_id, qty FROM orders
WHERE request_id = ANY($1::text[]) OR (sku = $2 AND user_id = ANY($3::text[]))
"""
# One page of a sku's orders for a rebuild, in the (sku, user_id) unique index's
# order after the last buyer of the page before, as one text: per order its
# request id, the done-hash record of gateway.redis.layout.encode_confirmed and its
# buyer, every field followed by a tab (ids never hold one, gateway.http.payloads);
# then the page's last buyer and its count of orders. One value to decode
# instead of a row per order: the gateway's work per page is one split.
ORDER_PAGE = """
SELECT string_agg(
    request_id || E'\\t' || order_id::text || '|' || user_id || '|' || qty::text || E'\\t'
    || user_id || E'\\t', '' ORDER BY user_id), max(user_id), count(*)
FROM (SELECT request_id, order_id, user_id, qty FROM orders
      WHERE sku = $1 AND user_id > $2 ORDER BY user_id LIMIT $3) AS page
"""
UNITS_SOLD = "SELECT COALESCE(SUM(qty), 0) FROM orders WHERE sku = $1"
# A new sku starts empty, so two concurrent creations both see the row (and
# wait for its lock) and each records only its own difference.
CREATE_SKU = """
INSERT INTO inventory (sku, stock) VALUES ($1, 0) ON CONFLICT (sku) DO NOTHING RETURNING sku
"""
SET_SKU = """
UPDATE inventory SET stock = $2, per_user_limit = $3, strategy = $4, updated_at = now()
WHERE sku = $1
"""
SET_SALE_RULES = """
UPDATE inventory SET starts_at = $2, ends_at = $3, user_rate = $4, client_rate = $5 WHERE sku = $1
"""
RESTOCK = """
UPDATE inventory SET stock = stock + $2, updated_at = now() WHERE sku = $1 RETURNING stock
"""
# A PUT replaces the whole sku, so no waiting room in it means none any more.
SET_WAITING_ROOM = """
UPDATE inventory
SET room_admit_per_s = $2, room_token_ttl_s = $3, room_shuffle_at_start = $4
WHERE sku = $1
"""
RECORD_MOVEMENT = """
INSERT INTO stock_movements (sku, delta, reason, stock_after) VALUES ($1, $2, $3, $4)
"""
# The window and rate limits of a strategy that decides in PostgreSQL alone, in
# one round trip: see sql/functions/sale_gate.sql.
SALE_GATE = "SELECT verdict, wait_ms FROM sale_gate($1, $2, $3, $4, $5, $6, $7, $8, $9)"
# Buckets past their expiry are full again: the same as no row.
PRUNE_RATE_BUCKETS = "DELETE FROM rate_buckets WHERE expires_at < now()"


# What a flush decided (flush_batch's rows), and the SQLSTATEs that refuse a batch.

# The SQLSTATEs flush_batch raises, each for one cause; nothing is written.
FLUSH_ERRORS: dict[str, type[Unavailable]] = {
    "FS001": FencedOut,  # a fencing token older than the row's
    "FS002": StockGuardRefused,  # the stock >= guard refused the batch
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


def _decision_of(row: asyncpg.Record) -> Decision:
    """One row of ``flush_batch`` as the decision on its purchase."""
    verdict = Verdict(row["verdict"])
    if verdict is Verdict.RELEASED:
        # The request id holds another purchase's order: never answered with it.
        return Decision(IdempotencyMismatch(row["request_id"]), verdict)
    if verdict is Verdict.CONFIRMED:
        order = Order(
            row["order_id"],
            row["request_id"],
            row["order_sku"],
            row["order_user"],
            row["order_qty"],
        )
        return Decision(Result(Outcome.CONFIRMED, order), verdict)
    if verdict is Verdict.EXPIRED:
        # Already given back by the reconciler: nothing to settle but the answer.
        return Decision(Unavailable("reservation expired; retry"), verdict)
    return Decision(DUPLICATE if verdict is Verdict.DUPLICATE else SOLD_OUT, verdict)


# A sku's settings as its inventory row holds them (read and written under the
# row lock of an admin change).


def _settings_of(row: asyncpg.Record) -> SkuSettings:
    """A sku's settings from its inventory row (``SKU_INFO``'s columns)."""
    room = None
    if row["room_admit_per_s"] is not None:
        room = WaitingRoom(
            row["room_admit_per_s"], row["room_token_ttl_s"], row["room_shuffle_at_start"]
        )
    return SkuSettings(
        stock=row["stock"],
        per_user_limit=row["per_user_limit"],
        starts_at=row["starts_at"],
        ends_at=row["ends_at"],
        user_rate=rate_from_db(row["user_rate"]),
        client_rate=rate_from_db(row["client_rate"]),
        waiting_room=room,
        strategy=None if row["strategy"] is None else Strategy(row["strategy"]),
    )


async def _write_settings(con: Connection, sku: str, new: SkuSettings) -> None:
    """Write every setting of ``sku`` (its row is locked)."""
    room = new.waiting_room
    await con.execute(SET_SKU, sku, new.stock, new.per_user_limit, new.strategy)
    await con.execute(
        SET_SALE_RULES,
        sku,
        new.starts_at,
        new.ends_at,
        _rate_text(new.user_rate),
        _rate_text(new.client_rate),
    )
    await con.execute(
        SET_WAITING_ROOM,
        sku,
        room and room.admit_per_s,
        room and room.token_ttl_s,
        bool(room and room.shuffle_at_start),
    )


def _rate_text(rate: Rate | str | None) -> str | None:
    """A rate as its column holds it: ``N/s:burst``, ``off`` or NULL."""
    return None if rate is None else str(rate)


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
        decisions = {row["request_id"]: _decision_of(row) for row in rows}
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
        return None if row is None else _settings_of(row).info(sku)

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

    async def priors(
        self, sku: str, request_ids: Sequence[str], user_ids: Sequence[str]
    ) -> tuple[dict[str, Order], set[str]]:
        """The orders these request ids made (of any sku), by request id, and
        which of these users bought ``sku``."""
        rows = await self._fetch(PRIOR_ORDERS, list(request_ids), sku, list(user_ids))
        found = [_order(r) for r in rows]
        wanted = set(request_ids)
        made = {o.request_id: o for o in found if o.request_id in wanted}
        return made, {o.user_id for o in found if o.sku == sku}

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
                before = _settings_of(row)
                after = replace(before, **fields)
                if after.starts_at and after.ends_at and after.ends_at <= after.starts_at:
                    raise InvalidRequest("ends_at must be after starts_at")
                await _write_settings(con, sku, after)
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
