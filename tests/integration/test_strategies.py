"""The synchronous strategies (sql-direct, optimistic, pessimistic) and per-sku
strategy selection, through the HTTP app on real Redis and PostgreSQL."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from gateway.audit import Finding, audit
from gateway.domain import Strategy
from gateway.layout import SkuKeys
from gateway.settings import Settings
from tests.support.polling import wait_for
from tests.support.purchases import (
    ADMIN_HEADERS,
    Client,
    buy,
    client_metric,
    db_state,
    put_sku,
    redis_state,
)

SYNCHRONOUS = ["sql-direct", "optimistic", "pessimistic"]
# Test-only: moves the version under the optimistic readers' feet (no stock taken).
BUMP_VERSION = "UPDATE inventory SET version = version + 1 WHERE sku = $1"
# How often a client resends a purchase answered 503 (same request id) in a storm.
RESENDS = 20


async def buy_resending(
    client: Client, sku: str, user: str, rid: str, qty: int = 1
) -> tuple[int, dict[str, Any]]:
    """Buy, resending with the same request id while the answer is 503, as a
    client honouring Retry-After does (bounded)."""
    for _ in range(RESENDS):
        status, body = await buy(client, sku, user, rid, qty)
        if status != 503:
            break
    return status, body


async def sku_json(client: Client, sku: str) -> dict[str, Any]:
    """``GET /v1/skus/{sku}`` (asserts a 200)."""
    resp = await client.get(f"/v1/skus/{sku}")
    assert resp.status == 200, await resp.text()
    data: dict[str, Any] = await resp.json()
    return data


async def storm(client: Client, sku: str, users: int) -> collections.Counter[str]:
    """Each of ``users`` buyers clicks twice at once (two request ids); the count of
    final answers by status, after asserting no buyer got two orders."""
    calls = [
        buy_resending(client, sku, f"u{i}", f"r{i}-{n}") for n in range(2) for i in range(users)
    ]
    results = await asyncio.gather(*calls)
    confirmed = [b["user_id"] for s, b in results if s == 201]
    assert len(confirmed) == len(set(confirmed)), "a buyer got two orders"
    return collections.Counter(str(b.get("status", b.get("error"))) for _, b in results)


class TestStorm:
    """Far more demand than stock sells exactly the stock, once per buyer, with no
    Redis state at all."""

    @pytest.mark.parametrize("strategy", SYNCHRONOUS)
    async def test_six_hundred_clicks_by_three_hundred_users_sell_exactly_fifty(
        self,
        start_gateway: Any,
        make_settings: Callable[..., Settings],
        sku: str,
        database_url: str,
        redis: Redis,
        key_prefix: str,
        strategy: str,
    ) -> None:
        """300 users click twice at once on 50 units: 50 confirmed to 50 users, the
        rest sold_out or duplicate, the database at 0 with 50 orders, no Redis
        counter or ledger, and the audit clean."""
        client = await start_gateway()
        await put_sku(client, sku, 50, strategy=strategy)
        outcomes = await storm(client, sku, 300)
        assert outcomes["confirmed"] == 50, outcomes
        assert outcomes["sold_out"] + outcomes["duplicate"] == 550, outcomes
        assert await db_state(database_url, sku) == (0, 50, 50)
        assert await redis_state(redis, key_prefix, sku) == (None, 0)
        [row] = await audit(make_settings(), sku)
        assert (row.sold, row.db_stock, row.redis_stock, row.verdict) == (50, 0, None, Finding.OK)


class TestAnswers:
    """Each synchronous strategy answers exactly as the API always has."""

    @pytest.mark.parametrize("strategy", SYNCHRONOUS)
    async def test_replay_duplicate_mismatch_and_the_unit_after_the_last(
        self, start_gateway: Any, sku: str, database_url: str, strategy: str
    ) -> None:
        """A replay returns its order (also after the sale sold out), the buyer's
        second request is a duplicate, another payload under the request id is a
        422, the last unit sells and the one after it is sold out."""
        client = await start_gateway()
        await put_sku(client, sku, 2, limit=2, strategy=strategy)
        status, first = await buy(client, sku, "alice", "a1")
        assert status == 201 and first["status"] == "confirmed"
        assert await buy(client, sku, "alice", "a1") == (201, first)
        assert await buy(client, sku, "alice", "a2") == (409, {"status": "duplicate"})
        status, body = await buy(client, sku, "alice", "a1", qty=2)
        assert (status, body["error"]) == (422, "idempotency_mismatch")
        status, body = await buy(client, sku, "mallory", "a1")
        assert (status, body["error"]) == (422, "idempotency_mismatch")
        assert (await buy(client, sku, "bob", "b1", qty=2))[1] == {"status": "sold_out"}
        assert (await buy(client, sku, "bob", "b1"))[0] == 201
        assert await buy(client, sku, "carol", "c1") == (409, {"status": "sold_out"})
        assert await buy(client, sku, "alice", "a1") == (201, first)
        assert await db_state(database_url, sku) == (0, 2, 2)

    @pytest.mark.parametrize("strategy", SYNCHRONOUS)
    async def test_one_request_id_sent_twenty_times_at_once_makes_one_order(
        self, start_gateway: Any, sku: str, database_url: str, strategy: str
    ) -> None:
        """Twenty copies of one purchase at once: all 201 with the same order, one
        unit taken (the losers' transactions rolled back with their stock)."""
        client = await start_gateway()
        await put_sku(client, sku, 5, strategy=strategy)
        results = await asyncio.gather(
            *(buy_resending(client, sku, "alice", "same") for _ in range(20))
        )
        assert {status for status, _ in results} == {201}
        assert len({body["order_id"] for _, body in results}) == 1
        assert await db_state(database_url, sku) == (4, 1, 1)

    @pytest.mark.parametrize("strategy", SYNCHRONOUS)
    async def test_one_buyer_with_twenty_request_ids_at_once_gets_one_order(
        self, start_gateway: Any, sku: str, database_url: str, strategy: str
    ) -> None:
        """One buyer, twenty request ids at once: one 201, nineteen duplicates."""
        client = await start_gateway()
        await put_sku(client, sku, 5, strategy=strategy)
        results = await asyncio.gather(
            *(buy_resending(client, sku, "alice", f"r{n}") for n in range(20))
        )
        statuses = collections.Counter(status for status, _ in results)
        assert statuses == {201: 1, 409: 19}
        assert await db_state(database_url, sku) == (4, 1, 1)


async def _waiting_on_the_row(database_url: str, count: int, needle: str = "version = $3") -> None:
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
            await _waiting_on_the_row(database_url, 4)
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
            await _waiting_on_the_row(database_url, 1)
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
        client = await start_gateway(queue_max=2)
        await put_sku(client, sku, 5, strategy="sql-direct")
        async with row_held(database_url, sku, "SELECT 1 FROM inventory WHERE sku = $1 FOR UPDATE"):
            waiting = [asyncio.create_task(buy(client, sku, f"u{i}", f"r{i}")) for i in range(2)]
            await _waiting_on_the_row(database_url, 2, "stock >= $2")
            status, body = await buy(client, sku, "late", "late")
        results = await asyncio.gather(*waiting)
        assert (status, body["error"]) == (503, "unavailable")
        assert await client_metric(client, "flashsale_shed_total") == 1
        assert [s for s, _ in results] == [201, 201]
        assert await db_state(database_url, sku) == (3, 2, 2)
