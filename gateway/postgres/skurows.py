"""A sku's settings as its ``inventory`` row holds them (``gateway.postgres.orders``
reads and writes them under the row lock of an admin change)."""

from __future__ import annotations

import asyncpg

from gateway.domain.model import SkuSettings, Strategy, WaitingRoom
from gateway.domain.rules import Rate, rate_from_db
from gateway.postgres.database import Connection
from gateway.postgres.statements import SET_SALE_RULES, SET_SKU, SET_WAITING_ROOM


def settings_of(row: asyncpg.Record) -> SkuSettings:
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


async def write_settings(con: Connection, sku: str, new: SkuSettings) -> None:
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
