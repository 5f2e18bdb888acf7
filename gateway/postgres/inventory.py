"""The inventory rows: which skus exist, and each sku's settings as an admin sets them.

A sku's row holds its stock, per-user limit, sale window, rate limits, waiting
room and strategy. An admin change rewrites them under the row's lock (admin
changes and flushes of the sku queue on it), recording every change of stock
as a stock movement in the same transaction, so the audit's books balance.
Driver errors become :class:`gateway.domain.errors.PostgresUnavailable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, NamedTuple

import asyncpg

from gateway.domain.errors import InvalidRequest
from gateway.domain.model import SkuInfo, SkuSettings, Strategy, WaitingRoom
from gateway.domain.rules import Rate, rate_from_db
from gateway.postgres.database import Connection, as_unavailable

SKU_INFO = """
SELECT stock, per_user_limit, room_admit_per_s, room_token_ttl_s, room_shuffle_at_start,
       starts_at, ends_at, user_rate, client_rate, strategy
FROM inventory WHERE sku = $1
"""
# The same, with the row locked for an admin change.
LOCK_SKU_SETTINGS = SKU_INFO.rstrip() + " FOR UPDATE\n"
ALL_SKUS = "SELECT sku FROM inventory ORDER BY sku"
# Skus sold through a waiting room (gateway.usecases.servable: they need an admission secret).
WAITING_ROOM_SKUS = """
SELECT sku FROM inventory WHERE room_admit_per_s IS NOT NULL ORDER BY sku LIMIT $1
"""
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


class SkuChange(NamedTuple):
    """A sku's settings before and after an admin change."""

    # None for a sku created by the change.
    before: SkuSettings | None
    after: SkuSettings


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


class Inventory:
    """Reads and admin changes of the inventory rows."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def sku_info(self, sku: str) -> SkuInfo | None:
        """The sku's per-user limit, sale rules, waiting room and strategy, or None
        when it does not exist."""
        with as_unavailable:
            row = await self._pool.fetchrow(SKU_INFO, sku)
        return None if row is None else _settings_of(row).info(sku)

    async def skus(self) -> list[str]:
        """Every sku in the inventory, by name."""
        with as_unavailable:
            return [r["sku"] for r in await self._pool.fetch(ALL_SKUS)]

    async def waiting_room_skus(self, limit: int) -> list[str]:
        """The first ``limit`` skus (by name) that have a waiting room."""
        with as_unavailable:
            return [r["sku"] for r in await self._pool.fetch(WAITING_ROOM_SKUS, limit)]

    async def change_sku(
        self, sku: str, fields: Mapping[str, Any], *, create: bool
    ) -> SkuChange | None:
        """Set ``fields`` (:class:`SkuSettings` attributes) on ``sku`` under its row
        lock, the others kept, recording a stock movement when ``stock`` is one
        of them; with ``create`` a missing sku is created first. Returns the
        change; None for a missing sku without ``create``. Raises
        :class:`InvalidRequest` when the window that results ends before it
        starts (nothing is written)."""
        with as_unavailable:
            async with self._pool.acquire() as con, con.transaction():
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
                return SkuChange(None if created else before, after)

    async def restock(self, sku: str, delta: int) -> int | None:
        """Add stock, recording the movement; returns the new stock, None if no sku."""
        with as_unavailable:
            async with self._pool.acquire() as con, con.transaction():
                after: int | None = await con.fetchval(RESTOCK, sku, delta)
                if after is not None:
                    await con.execute(RECORD_MOVEMENT, sku, delta, "restock", after)
                return after
