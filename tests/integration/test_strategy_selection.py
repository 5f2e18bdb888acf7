"""Per-sku strategy selection (every strategy selling at once, switching, bad
values) and the shedding of synchronous purchases, through the HTTP app on real
Redis and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.domain.model import Strategy
from gateway.ops.audit import Finding, audit
from gateway.redis.layout import SkuKeys
from gateway.settings import Settings
from testkit.purchases import (
    ADMIN_HEADERS,
    buy,
    client_metric,
    db_state,
    put_sku,
    redis_state,
    sku_json,
    storm,
)
from testkit.rowlocks import row_held, waiting_on_the_row


class TestSelection:
    """GATEWAY_STRATEGY and the per-sku override: one gateway, every strategy at once."""

    async def test_four_skus_on_four_strategies_sell_at_once(
        self,
        start_gateway: Any,
        make_settings: Callable[..., Settings],
        sku: str,
        database_url: str,
        redis: Redis,
        key_prefix: str,
    ) -> None:
        """With GATEWAY_STRATEGY=optimistic, a sku without an override sells
        optimistic and three others sell reserve-batch, sql-direct and pessimistic,
        all in one storm: each sells exactly its stock; only the reserve-batch sku
        has Redis state; GET /v1/skus names each one's strategy; the reconciler
        and the audit compare no Redis counter for the others (not even a stale one
        left behind), so they find nothing to repair."""
        client = await start_gateway(strategy=Strategy.OPTIMISTIC)
        chosen = {"plain": None, "rb": "reserve-batch", "sd": "sql-direct", "pe": "pessimistic"}
        for name, strategy in chosen.items():
            await put_sku(client, f"{sku}-{name}", 20, strategy=strategy)
        counts = await asyncio.gather(*(storm(client, f"{sku}-{name}", 60) for name in chosen))
        assert [c["confirmed"] for c in counts] == [20] * 4
        for name, strategy in chosen.items():
            s = f"{sku}-{name}"
            assert await db_state(database_url, s) == (0, 20, 20)
            shown = await sku_json(client, s)
            assert shown == {
                "sku": s,
                "available": 0,
                "strategy": strategy or "optimistic",
                "starts_at": None,
                "ends_at": None,
                "waiting_room": False,
            }
            expected_redis = (0, 0) if name == "rb" else (None, 0)
            assert await redis_state(redis, key_prefix, s) == expected_redis
        stale = SkuKeys.of(key_prefix, f"{sku}-sd").stock
        await redis.set(stale, 7)  # as a reserve-batch sale long ago might have left it
        resp = await client.post("/admin/reconcile", headers=ADMIN_HEADERS)
        done = await resp.json()
        for name in chosen:
            assert done[f"{sku}-{name}"] == {
                "confirmed": 0,
                "released": 0,
                "pending": 0,
                "drift": 0,
                "repaired": False,
            }
        rows = [r for r in await audit(make_settings()) if r.sku.startswith(sku)]
        assert [r.verdict for r in rows] == [Finding.OK] * 4
        assert await redis_state(redis, key_prefix, f"{sku}-plain") == (None, 0)
        assert await redis.get(stale) == b"7"

    async def test_switching_strategies_keeps_every_order_and_buyer(
        self,
        start_gateway: Any,
        make_settings: Callable[..., Settings],
        sku: str,
        database_url: str,
    ) -> None:
        """A sku sold under reserve-batch, then optimistic, then reserve-batch again:
        each earlier buyer is a duplicate and each earlier request id replays its
        order under every later strategy; the books balance."""
        client = await start_gateway()
        await put_sku(client, sku, 3)
        status, alice = await buy(client, sku, "alice", "a")
        assert status == 201
        await put_sku(client, sku, 2, strategy="optimistic")
        assert (await sku_json(client, sku))["strategy"] == "optimistic"
        assert await buy(client, sku, "alice", "a2") == (409, {"status": "duplicate"})
        assert await buy(client, sku, "alice", "a") == (201, alice)
        status, bob = await buy(client, sku, "bob", "b")
        assert status == 201
        await put_sku(client, sku, 5, strategy="reserve-batch")
        assert await sku_json(client, sku) == {
            "sku": sku,
            "available": 5,
            "strategy": "reserve-batch",
            "starts_at": None,
            "ends_at": None,
            "waiting_room": False,
        }
        assert await buy(client, sku, "bob", "b2") == (409, {"status": "duplicate"})
        assert await buy(client, sku, "bob", "b") == (201, bob)
        assert await buy(client, sku, "alice", "a") == (201, alice)
        assert (await buy(client, sku, "carol", "c"))[0] == 201
        assert await db_state(database_url, sku) == (4, 3, 3)
        [row] = await audit(make_settings(), sku)
        assert row.verdict is Finding.OK

    @pytest.mark.parametrize(
        ("strategy", "detail"),
        [
            ("fastest", "strategy must be one of"),
            (7, "strategy must be one of"),
        ],
    )
    async def test_an_unknown_strategy_is_a_400_and_changes_nothing(
        self, start_gateway: Any, sku: str, strategy: object, detail: str
    ) -> None:
        """An unknown strategy, a non-string, or one this gateway does not serve is a
        400 invalid_request naming the problem; the sku keeps its strategy."""
        client = await start_gateway()
        await put_sku(client, sku, 3, strategy="pessimistic")
        resp = await client.put(
            f"/admin/skus/{sku}", json={"stock": 9, "strategy": strategy}, headers=ADMIN_HEADERS
        )
        assert resp.status == 400
        body = await resp.json()
        assert body["error"] == "invalid_request" and detail in body["detail"]
        assert await sku_json(client, sku) == {
            "sku": sku,
            "available": 3,
            "strategy": "pessimistic",
            "starts_at": None,
            "ends_at": None,
            "waiting_room": False,
        }

    async def test_null_or_absent_strategy_sells_under_the_gateways(
        self, start_gateway: Any, sku: str
    ) -> None:
        """``"strategy": null`` (or none given) drops the override: the sku follows
        GATEWAY_STRATEGY; the PUT answers the strategy it will sell under."""
        client = await start_gateway(strategy=Strategy.SQL_DIRECT)
        await put_sku(client, sku, 3, strategy="pessimistic")
        resp = await client.put(
            f"/admin/skus/{sku}", json={"stock": 3, "strategy": None}, headers=ADMIN_HEADERS
        )
        assert (await resp.json())["strategy"] == "sql-direct"
        assert (await sku_json(client, sku))["strategy"] == "sql-direct"


class TestShedding:
    """Synchronous purchases waiting for the database are bounded like the batch queue."""

    async def test_beyond_the_queue_bound_a_purchase_is_shed_with_503(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """With GATEWAY_QUEUE_MAX=2 and the sku's row locked elsewhere, two sql-direct
        purchases wait; a third is answered 503 at once and counted as shed; once
        the row is free the two waiting ones are confirmed."""
        client = await start_gateway(backlog_max=2)
        await put_sku(client, sku, 5, strategy="sql-direct")
        async with row_held(database_url, sku, "SELECT 1 FROM inventory WHERE sku = $1 FOR UPDATE"):
            waiting = [asyncio.create_task(buy(client, sku, f"u{i}", f"r{i}")) for i in range(2)]
            await waiting_on_the_row(database_url, 2, "stock >= $2")
            status, body = await buy(client, sku, "late", "late")
        results = await asyncio.gather(*waiting)
        assert (status, body["error"]) == (503, "unavailable")
        assert await client_metric(client, "flashsale_shed_total") == 1
        assert [s for s, _ in results] == [201, 201]
        assert await db_state(database_url, sku) == (3, 2, 2)
