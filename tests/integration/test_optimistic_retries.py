"""The optimistic strategy's retries: a lost race retried and counted, a spent
budget a 503, through the HTTP app on real Redis and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

from testkit.purchases import (
    buy,
    client_metric,
    db_state,
    put_sku,
)
from testkit.rowlocks import row_held, waiting_on_the_row

# Test-only: moves the version under the optimistic readers' feet (no stock taken).
BUMP_VERSION = "UPDATE inventory SET version = version + 1 WHERE sku = $1"


class TestOptimisticRetries:
    """A lost race is retried outside the transaction, shows in the metrics, and a
    spent budget is a 503, never a false 201."""

    async def test_every_purchase_that_lost_the_race_is_retried_and_confirmed(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """Four purchases read the version, then wait on a row another transaction
        changed: that commit makes all four conflict; each retries and is
        confirmed, and conflicts and retries count at least four each."""
        client = await start_gateway()
        await put_sku(client, sku, 10, strategy="optimistic")
        async with row_held(database_url, sku, BUMP_VERSION):
            buys = [asyncio.create_task(buy(client, sku, f"u{i}", f"r{i}")) for i in range(4)]
            await waiting_on_the_row(database_url, 4)
        results = await asyncio.gather(*buys)
        assert [status for status, _ in results] == [201] * 4
        assert await client_metric(client, "flashsale_optimistic_conflicts_total") >= 4
        assert await client_metric(client, "flashsale_optimistic_retries_total") >= 4
        assert await client_metric(client, "flashsale_optimistic_exhausted_total") == 0
        assert await db_state(database_url, sku) == (6, 4, 4)

    async def test_a_spent_budget_is_a_503_and_nothing_is_written(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """With one attempt, a lost race answers 503 unavailable with Retry-After and
        writes nothing; the same request id sent again is confirmed."""
        client = await start_gateway(optimistic_attempts=1)
        await put_sku(client, sku, 3, strategy="optimistic")
        async with row_held(database_url, sku, BUMP_VERSION):
            lost = asyncio.create_task(
                client.post("/v1/purchase", json={"sku": sku, "user_id": "u", "request_id": "x1"})
            )
            await waiting_on_the_row(database_url, 1)
        resp = await lost
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "1"
        assert (await resp.json())["error"] == "unavailable"
        assert await db_state(database_url, sku) == (3, 0, 0)
        assert await client_metric(client, "flashsale_optimistic_exhausted_total") == 1
        resp = await client.post(
            "/v1/purchase", json={"sku": sku, "user_id": "u", "request_id": "x1"}
        )
        assert resp.status == 201
        assert await db_state(database_url, sku) == (2, 1, 1)
