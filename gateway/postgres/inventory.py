"""The inventory rows: which skus exist, and each sku's settings as an admin sets them.

A sku's row holds its stock, per-user limit, sale window, rate limits, waiting
room and strategy; its display fields have a row of their own in
``sku_display``. An admin change rewrites them under the inventory row's lock
(admin changes and flushes of the sku queue on it), recording every change of
stock as a stock movement in the same transaction, so the audit's books balance.
Driver errors become :class:`gateway.domain.errors.PostgresUnavailable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

import asyncpg

from gateway.domain.errors import InvalidRequest, LimitGroupLocked, UnknownLimitGroup
from gateway.domain.model import (
    NO_DISPLAY,
    Display,
    LimitGroup,
    SkuInfo,
    SkuSettings,
    Strategy,
    WaitingRoom,
)
from gateway.domain.rules import Rate, rate_from_db
from gateway.domain.skus import IfMissing, SkuChange, SkuListing, SkuSheet, SkuState
from gateway.postgres.database import Connection, as_unavailable

# The display fields come from a table of their own (sql/012_display_fields.sql).
# With the sku's limit group: its limit and every sku in it (archived ones
# too: their buyers' orders still count), by name.
SKU_INFO = """
SELECT stock, inventory.per_user_limit, room_admit_per_s, room_token_ttl_s,
       room_shuffle_at_start, room_bot_check, starts_at, ends_at, user_rate, client_rate,
       strategy, payment_window_s, title, image_url, price_text, inventory.limit_group,
       lg.per_user_limit AS group_limit,
       (SELECT array_agg(m.sku ORDER BY m.sku) FROM inventory m
        WHERE m.limit_group = inventory.limit_group) AS group_skus
FROM inventory LEFT JOIN sku_display USING (sku)
    LEFT JOIN limit_groups lg ON lg.limit_group = inventory.limit_group
WHERE sku = $1 AND archived_at IS NULL
"""
# The same, with the row locked for an admin change. An archived sku is not
# there for purchases or changes (404 unknown_sku) until a PUT lists it again.
# The inventory row's lock covers its display row too: only admin changes,
# which take it first, write that one.
LOCK_SKU_SETTINGS = SKU_INFO.rstrip() + " FOR UPDATE OF inventory\n"
# Skus sold through a waiting room (gateway.usecases.servable: they need an admission secret).
WAITING_ROOM_SKUS = """
SELECT sku FROM inventory WHERE room_admit_per_s IS NOT NULL AND archived_at IS NULL
ORDER BY sku LIMIT $1
"""
# Those whose room checks for bots (they need GATEWAY_BOT_CHECK_URL too).
BOT_CHECK_SKUS = """
SELECT sku FROM inventory
WHERE room_admit_per_s IS NOT NULL AND room_bot_check AND archived_at IS NULL
ORDER BY sku LIMIT $1
"""
# Units of a sku held for payment: the one expression that makes a sku with
# holds active and feeds its held gauge (flashsale_sku_held); the partial index
# orders_pending_sku serves it.
HELD = """(SELECT COALESCE(SUM(qty), 0) FROM orders AS o
    WHERE o.sku = inventory.sku AND o.status = 'pending_payment')"""
# Active: a sku whose state may still change by itself, the only ones the
# reconciler, the per-sku metrics and the writers' discovery visit. A sku stops
# being active when the reconciler finds it exhausted (or archived) with
# nothing pending or held, and records the updated_at it found then
# (idle_at); every change of the row (a flush, a restock, an admin change,
# an archive, a return of units) sets updated_at = now(), so the sku is active
# again on every instance at once, by the next pass of each.
ACTIVE = f"(idle_at IS DISTINCT FROM updated_at OR {HELD} > 0)"
SKU_STATE = f"""
SELECT sku, stock, {HELD} AS held,
       (SELECT COALESCE(SUM(qty), 0) FROM orders AS o
        WHERE o.sku = inventory.sku AND o.status IN ('confirmed', 'paid')) AS sold,
       updated_at, archived_at IS NOT NULL AS archived, {ACTIVE} AS active
FROM inventory
"""
ACTIVE_SKUS = f"{SKU_STATE} WHERE {ACTIVE} ORDER BY sku"
ACTIVE_NAMES = f"SELECT sku FROM inventory WHERE {ACTIVE} ORDER BY sku"
ALL_SKUS = f"{SKU_STATE} ORDER BY sku"
# The reconciler found the sku exhausted (or archived), nothing pending or held,
# at the change it read (updated_at): idle until the next change.
MARK_IDLE = "UPDATE inventory SET idle_at = updated_at WHERE sku = $1 AND updated_at = $2"
# An idle sku found changing without its row (Redis after a failover): active again.
MARK_ACTIVE = "UPDATE inventory SET idle_at = NULL WHERE sku = $1"
ARCHIVE = """
UPDATE inventory SET archived_at = now(), updated_at = now()
WHERE sku = $1 AND archived_at IS NULL RETURNING archived_at
"""
ARCHIVED_AT = "SELECT archived_at FROM inventory WHERE sku = $1"
# A PUT of an archived sku lists it again (gateway.usecases.admin.StockAdmin.change_sku).
UNARCHIVE = """
UPDATE inventory SET archived_at = NULL, updated_at = now()
WHERE sku = $1 AND archived_at IS NOT NULL RETURNING sku
"""
# A sku's every setting, its status and its orders' units by status, archived
# or not (GET /admin/skus/{sku}).
SKU_SHEET = f"""
SELECT stock, per_user_limit, room_admit_per_s, room_token_ttl_s, room_shuffle_at_start,
       starts_at, ends_at, user_rate, client_rate, strategy, payment_window_s,
       room_bot_check, title, image_url, price_text, limit_group, archived_at,
       {ACTIVE} AS active, u.*
FROM inventory LEFT JOIN sku_display USING (sku)
CROSS JOIN LATERAL (
    SELECT COALESCE(SUM(qty) FILTER (WHERE status = 'confirmed'), 0) AS confirmed,
           COALESCE(SUM(qty) FILTER (WHERE status = 'paid'), 0) AS paid,
           COALESCE(SUM(qty) FILTER (WHERE status = 'pending_payment'), 0) AS held,
           COALESCE(SUM(qty) FILTER (WHERE status = 'refunded' AND NOT restocked), 0)
               AS refunded_not_restocked
    FROM orders AS o WHERE o.sku = inventory.sku) u
WHERE sku = $1
"""
# Keyset pagination on the sku: every page costs one index range, however deep.
LIST_SKUS = f"""
SELECT sku, stock, archived_at, {ACTIVE} AS active FROM inventory
WHERE sku > $1 AND ($2 = 'all'
    OR ($2 = 'archived' AND archived_at IS NOT NULL)
    OR ($2 = 'active' AND archived_at IS NULL AND {ACTIVE})
    OR ($2 = 'idle' AND archived_at IS NULL AND NOT {ACTIVE}))
ORDER BY sku LIMIT $3
"""
# A new sku starts empty, so two concurrent creations both see the row (and
# wait for its lock) and each records only its own difference.
CREATE_SKU = """
INSERT INTO inventory (sku, stock) VALUES ($1, 0) ON CONFLICT (sku) DO NOTHING RETURNING sku
"""
SET_SKU = """
UPDATE inventory SET stock = $2, per_user_limit = $3, strategy = $4, payment_window_s = $5,
    updated_at = now()
WHERE sku = $1
"""
SET_LIMIT_GROUP = "UPDATE inventory SET limit_group = $2 WHERE sku = $1"
# The group a sku joins exists, and stays until this change commits.
GROUP_EXISTS = "SELECT 1 FROM limit_groups WHERE limit_group = $1 FOR SHARE"
# A sku's units held in its group's holdings: those of its live orders.
LIVE_ORDERS = """
SELECT EXISTS (SELECT 1 FROM orders
    WHERE sku = $1 AND status IN ('confirmed', 'pending_payment', 'paid'))
"""
SET_SALE_RULES = """
UPDATE inventory SET starts_at = $2, ends_at = $3, user_rate = $4, client_rate = $5 WHERE sku = $1
"""
RESTOCK = """
UPDATE inventory SET stock = stock + $2, updated_at = now()
WHERE sku = $1 AND archived_at IS NULL RETURNING stock
"""
# A PUT replaces the whole sku, so no waiting room in it means none any more.
SET_WAITING_ROOM = """
UPDATE inventory
SET room_admit_per_s = $2, room_token_ttl_s = $3, room_shuffle_at_start = $4,
    room_bot_check = $5
WHERE sku = $1
"""
SET_DISPLAY = """
INSERT INTO sku_display (sku, title, image_url, price_text) VALUES ($1, $2, $3, $4)
ON CONFLICT (sku) DO UPDATE
SET title = excluded.title, image_url = excluded.image_url, price_text = excluded.price_text
"""
DISPLAY = "SELECT title, image_url, price_text FROM sku_display WHERE sku = $1"
# A sku without display fields keeps no row.
CLEAR_DISPLAY = "DELETE FROM sku_display WHERE sku = $1"
RECORD_MOVEMENT = """
INSERT INTO stock_movements (sku, delta, reason, stock_after) VALUES ($1, $2, $3, $4)
"""


def _settings_of(row: asyncpg.Record) -> SkuSettings:
    """A sku's settings from its inventory row (``SKU_INFO``'s columns)."""
    room = None
    if row["room_admit_per_s"] is not None:
        room = WaitingRoom(
            row["room_admit_per_s"],
            row["room_token_ttl_s"],
            row["room_shuffle_at_start"],
            row["room_bot_check"],
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
        payment_window_s=row["payment_window_s"],
        title=row["title"],
        image_url=row["image_url"],
        price_text=row["price_text"],
        limit_group=row["limit_group"],
    )


def _group_of(row: asyncpg.Record) -> LimitGroup | None:
    """A sku's limit group from its ``SKU_INFO`` row, if it has one."""
    if row["limit_group"] is None:
        return None
    return LimitGroup(row["limit_group"], row["group_limit"], tuple(row["group_skus"]))


async def _write_settings(con: Connection, sku: str, new: SkuSettings) -> None:
    """Write every setting of ``sku`` (its row is locked)."""
    room = new.waiting_room
    await con.execute(
        SET_SKU, sku, new.stock, new.per_user_limit, new.strategy, new.payment_window_s
    )
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
        bool(room and room.bot_check),
    )


async def _join_group(con: Connection, sku: str, group: str | None, *, created: bool) -> None:
    """Move ``sku`` (its row locked) into ``group`` (None: out of its group).
    Raises :class:`UnknownLimitGroup` for a group that does not exist and
    :class:`LimitGroupLocked` while the sku has a live order, whose units its
    group's holdings count (nothing is written)."""
    if group is not None and await con.fetchval(GROUP_EXISTS, group) is None:
        raise UnknownLimitGroup(f"no limit group {group!r}")
    if not created and await con.fetchval(LIVE_ORDERS, sku):
        raise LimitGroupLocked("the sku has live orders: its group changes once none is left")
    await con.execute(SET_LIMIT_GROUP, sku, group)


async def _write_display(con: Connection, sku: str, shown: Display) -> None:
    """Write the display fields of ``sku`` (its inventory row is locked)."""
    if shown == NO_DISPLAY:
        await con.execute(CLEAR_DISPLAY, sku)
    else:
        await con.execute(SET_DISPLAY, sku, shown.title, shown.image_url, shown.price_text)


def _rate_text(rate: Rate | str | None) -> str | None:
    """A rate as its column holds it: ``N/s:burst``, ``off`` or NULL."""
    return None if rate is None else str(rate)


class Inventory:
    """Reads and admin changes of the inventory rows."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def sku_info(self, sku: str) -> SkuInfo | None:
        """The sku's per-user limit, sale rules, waiting room and strategy, or None
        when it does not exist."""
        with as_unavailable:
            row = await self._pool.fetchrow(SKU_INFO, sku)
        return None if row is None else _settings_of(row).info(sku, _group_of(row))

    async def display(self, sku: str) -> Display:
        """The display fields of ``sku``, archived or not (none without a row)."""
        with as_unavailable:
            row = await self._pool.fetchrow(DISPLAY, sku)
        return NO_DISPLAY if row is None else Display(*row)

    async def sheet(self, sku: str) -> SkuSheet | None:
        """Every setting of ``sku``, its status and its orders' units by status,
        archived or not; None when no such sku exists."""
        with as_unavailable:
            row = await self._pool.fetchrow(SKU_SHEET, sku)
        if row is None:
            return None
        listing = SkuListing(sku, row["stock"], row["archived_at"], row["active"])
        return SkuSheet(
            _settings_of(row),
            listing,
            row["confirmed"],
            row["paid"],
            row["held"],
            row["refunded_not_restocked"],
        )

    async def states(self, *, every: bool = False) -> list[SkuState]:
        """The active skus (``ACTIVE``), by name; ``every`` sku of the inventory,
        archived ones included, when asked."""
        with as_unavailable:
            rows = await self._pool.fetch(ALL_SKUS if every else ACTIVE_SKUS)
        return [SkuState(*r) for r in rows]

    async def active_skus(self) -> list[str]:
        """The names of the active skus (without the sums of their states)."""
        with as_unavailable:
            return [r["sku"] for r in await self._pool.fetch(ACTIVE_NAMES)]

    async def mark_idle(self, sku: str, updated_at: datetime) -> bool:
        """Record that ``sku`` was found with nothing left to change by itself at
        its change ``updated_at``; False when it changed since (it stays active)."""
        with as_unavailable:
            done: str = await self._pool.execute(MARK_IDLE, sku, updated_at)
        return done == "UPDATE 1"

    async def mark_active(self, sku: str) -> None:
        """Make ``sku`` active again whatever its row says."""
        with as_unavailable:
            await self._pool.execute(MARK_ACTIVE, sku)

    async def archive(self, sku: str) -> tuple[datetime, bool] | None:
        """Archive ``sku``: (when it was archived, whether by this call); None
        when no such sku exists."""
        with as_unavailable:
            now: datetime | None = await self._pool.fetchval(ARCHIVE, sku)
            if now is not None:
                return now, True
            before: datetime | None = await self._pool.fetchval(ARCHIVED_AT, sku)
        return None if before is None else (before, False)

    async def listing(self, status: str, after: str, limit: int) -> list[SkuListing]:
        """Up to ``limit`` skus named after ``after``, by name, of ``status``
        (``active``, ``idle``, ``archived`` or ``all``)."""
        with as_unavailable:
            rows = await self._pool.fetch(LIST_SKUS, after, status, limit)
        return [SkuListing(*r) for r in rows]

    async def waiting_room_skus(self, limit: int) -> list[str]:
        """The first ``limit`` skus (by name) that have a waiting room."""
        with as_unavailable:
            return [r["sku"] for r in await self._pool.fetch(WAITING_ROOM_SKUS, limit)]

    async def bot_check_skus(self, limit: int) -> list[str]:
        """The first ``limit`` skus (by name) whose waiting room checks for bots."""
        with as_unavailable:
            return [r["sku"] for r in await self._pool.fetch(BOT_CHECK_SKUS, limit)]

    async def change_sku(
        self, sku: str, fields: Mapping[str, Any], *, if_missing: IfMissing
    ) -> SkuChange | None:
        """Set ``fields`` (:class:`SkuSettings` attributes) on ``sku`` under its row
        lock, the others kept, recording a stock movement when ``stock`` is one
        of them; with ``IfMissing.CREATE`` a missing sku is created first (an
        archived one listed again). Returns the change; None for a missing sku
        with ``IfMissing.REFUSE``. Raises
        :class:`InvalidRequest` when the window that results ends before it
        starts (nothing is written)."""
        with as_unavailable:
            async with self._pool.acquire() as con, con.transaction():
                create = if_missing is IfMissing.CREATE
                created = create and await con.fetchval(CREATE_SKU, sku) is not None
                # A PUT of an archived sku lists it again, as a shop re-listing it expects.
                listed = create and not created and await con.fetchval(UNARCHIVE, sku) is not None
                row = await con.fetchrow(LOCK_SKU_SETTINGS, sku)
                if row is None:
                    return None
                before = _settings_of(row)
                after = replace(before, **fields)
                if after.starts_at and after.ends_at and after.ends_at <= after.starts_at:
                    raise InvalidRequest("ends_at must be after starts_at")
                if after == before and not (created or listed):
                    # Settings put back as they were (a GET's, say): no write, so
                    # no stock movement and no updated_at that would wake an idle sku.
                    return SkuChange(before, after)
                await _write_settings(con, sku, after)
                if after.limit_group != before.limit_group:
                    await _join_group(con, sku, after.limit_group, created=created)
                if after.display != before.display:
                    await _write_display(con, sku, after.display)
                if "stock" in fields:
                    delta = after.stock - before.stock
                    await con.execute(RECORD_MOVEMENT, sku, delta, "set", after.stock)
                return SkuChange(None if created else before, after, listed)

    async def restock(self, sku: str, delta: int) -> int | None:
        """Add stock, recording the movement; returns the new stock, None if no sku."""
        with as_unavailable:
            async with self._pool.acquire() as con, con.transaction():
                after: int | None = await con.fetchval(RESTOCK, sku, delta)
                if after is not None:
                    await con.execute(RECORD_MOVEMENT, sku, delta, "restock", after)
                return after
