"""The flush statement is prepared once per connection and reused (asyncpg's cache)."""

from __future__ import annotations

import time
from typing import Any

import asyncpg

from gateway.domain.model import Outcome, Purchase
from gateway.postgres.orders import FLUSH_BATCH, Orders
from testkit.purchases import put_sku


class TestPreparedStatements:
    """Hot statements go through asyncpg's statement cache: parsed and planned once."""

    async def test_flushes_reuse_one_prepared_statement(
        self, start_gateway: Any, database_url: str, sku: str
    ) -> None:
        """Three flushes on one connection commit their orders, and that connection
        holds exactly one prepared statement of the flush (not one per flush, not an
        unnamed one parsed every time)."""
        client = await start_gateway()  # migrated, and the sku created through the API
        await put_sku(client, sku, 10)
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
        assert pool is not None
        try:
            orders = Orders(pool)
            now_ms = int(time.time() * 1000)
            for i in range(3):
                batch = [Purchase(sku, f"p{i}", 1, f"{sku}.prep-{i}", now_ms)]
                decision = await orders.commit_batch(sku, batch, None)
                result = decision.decisions[f"{sku}.prep-{i}"].result
                assert not isinstance(result, BaseException)
                assert result.outcome is Outcome.CONFIRMED
            async with pool.acquire() as con:
                prepared = await con.fetchval(
                    "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1",
                    FLUSH_BATCH,
                )
            assert prepared == 1
        finally:
            await pool.close()
