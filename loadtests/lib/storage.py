"""A run's databases and Redis keys: created, tuned and removed (blocking calls,
for plain scripts and the pytest process alike)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import asyncpg
import redis

from loadtests.lib.options import PG_URL, REDIS_URL
from testkit import services


def drop_database(name: str, server_url: str = PG_URL) -> None:
    """Drop database ``name`` if it exists, disconnecting whoever is still in it."""
    asyncio.run(services.drop_database(name, server_url))


def set_database_settings(name: str, settings: Mapping[str, str], server_url: str = PG_URL) -> None:
    """``ALTER DATABASE name SET key = value`` for each setting (new sessions see them)."""

    async def alter() -> None:
        con = await asyncpg.connect(server_url)
        try:
            quoted = services.quote_ident(name)
            for key, value in settings.items():
                if not key.replace("_", "").replace(".", "").isalnum():
                    raise ValueError(f"not a setting name: {key!r}")
                literal = "'" + value.replace("'", "''") + "'"
                await con.execute(f"ALTER DATABASE {quoted} SET {key} = {literal}")
        finally:
            await con.close()

    asyncio.run(alter())


def delete_keys(prefix: str, redis_url: str = REDIS_URL) -> int:
    """Delete every Redis key under ``prefix:``; returns how many."""
    client = redis.Redis.from_url(redis_url)
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += client.unlink(*batch)
                batch.clear()
        if batch:
            deleted += client.unlink(*batch)
    finally:
        client.close()
    return deleted
