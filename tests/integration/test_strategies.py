"""The synchronous strategies (sql-direct, optimistic, pessimistic) under a storm
and in their answers, through the HTTP app on real Redis and PostgreSQL.
Optimistic retries: ``test_optimistic_retries.py``; per-sku selection and
shedding: ``test_strategy_selection.py``."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.ops.audit import Finding, audit
from gateway.settings import Settings
from testkit.purchases import (
    buy,
    buy_resending,
    db_state,
    put_sku,
    redis_state,
    storm,
)

SYNCHRONOUS = ["sql-direct", "optimistic", "pessimistic"]


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
