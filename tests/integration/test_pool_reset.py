"""The gateway's PostgreSQL pool: what a connection carries back into it.

A connection goes back without asyncpg's reset query (a round trip per use)
unless the PostgreSQL flush lock shares the pool: that lock keeps session
advisory locks on pool connections, and a lost hold is freed only by the
reset's ``pg_advisory_unlock_all()``.
"""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
import pytest

from gateway.lock import advisory_key
from gateway.postgres.database import create_pool
from gateway.settings import Settings

TRY_LOCK = "SELECT pg_try_advisory_lock($1)"


@pytest.mark.parametrize(("flush_lock", "freed"), [("redis", False), ("postgres", True)])
async def test_a_released_connection_keeps_its_session_only_without_the_postgres_lock(
    make_settings: Callable[..., Settings], database_url: str, flush_lock: str, freed: bool
) -> None:
    """A session advisory lock left on a released connection: freed with the
    postgres flush lock (the reset ran), kept otherwise, where the only
    statement the release sent was the one the caller ran."""
    key = advisory_key(f"test_pool_reset:{flush_lock}")
    pool = await create_pool(make_settings(flush_lock=flush_lock))
    other = await asyncpg.connect(database_url)
    try:
        sent: list[str] = []
        async with pool.acquire() as con:
            con.add_query_logger(lambda record: sent.append(record.query))
            assert await con.fetchval("SELECT pg_advisory_lock($1) IS NOT NULL", key)
        assert await other.fetchval(TRY_LOCK, key) is freed
        if not freed:
            assert sent == ["SELECT pg_advisory_lock($1) IS NOT NULL"], sent
    finally:  # closing the pool ends the session and any lock it kept
        await other.execute("SELECT pg_advisory_unlock_all()")
        await other.close()
        await pool.close()
