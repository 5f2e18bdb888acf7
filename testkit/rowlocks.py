"""A sku's inventory row held from another PostgreSQL connection, and the wait
until statements queue behind a row lock: for tests of the synchronous strategies."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg

from testkit.polling import wait_for


async def waiting_on_the_row(database_url: str, count: int, needle: str = "version = $3") -> None:
    """Wait until ``count`` statements containing ``needle`` (by default the
    optimistic UPDATE) wait for a row lock."""
    con = await asyncpg.connect(database_url)
    try:

        async def waiting() -> bool:
            n = await con.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND position($1 in query) > 0",
                needle,
            )
            return bool(n >= count)

        await wait_for(waiting, within=10, what=f"{count} statements waiting on a row lock")
    finally:
        await con.close()


@contextlib.asynccontextmanager
async def row_held(database_url: str, sku: str, statement: str) -> AsyncIterator[None]:
    """Run ``statement`` on the sku's row in a transaction of another connection that
    stays open, holding the row's lock, until the block ends; then commit it."""
    con = await asyncpg.connect(database_url)
    try:
        async with con.transaction():
            await con.execute(statement, sku)
            yield
    finally:
        await con.close()
