"""One reserve.lua call per sku and loop turn (issue 13's reservations in one
call), each purchase answered as if it had had a call of its own, on one Redis
and on a cluster, through an in-process gateway on real Redis and PostgreSQL."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from redis.asyncio import Redis

from gateway.domain.model import Purchase, SkuInfo
from gateway.domain.rules import Rate, SaleRules
from gateway.http.appkeys import RESERVATIONS
from gateway.redis.layout import SkuKeys, call_key
from gateway.redis.scripts import read_script
from testkit.purchases import buy, db_state, put_rules, redis_state
from testkit.redis_cluster import LocalRedisCluster

# One sku's purchases as (user, request id, qty), with what each is told: a
# first buyer, a repeat click, a user over the limit (0.01/s:2), a request id
# reused by someone else, a replay in flight, a buyer of the last two units and
# one too many.
STORM = [
    ("u1", "r1", 1, "ok"),
    ("u1", "r2", 1, "duplicate"),
    ("u1", "r3", 1, "rate_limited"),
    ("u2", "r1", 1, "mismatch"),
    ("u1", "r1", 1, "in_progress"),
    ("u3", "r5", 2, "ok"),
    ("u4", "r6", 1, "sold_out"),
]


class TestReserveMany:
    """The reservations of one loop turn go to Redis as one reserve.lua call per
    sku, and each is answered exactly as if it had had a call of its own."""

    async def test_one_call_answers_each_purchase_as_calls_in_a_row_would(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """The same purchases reserved at once (one turn, one call) on one sku and
        one after the other on a twin sku get the same replies, in order, and leave
        the same stock, buyers and ledger."""
        client = await start_gateway()
        reservations = client.app[RESERVATIONS]
        together, apart = f"{sku}-together", f"{sku}-apart"
        rules = SaleRules(user_rate=Rate(0.01, 2))
        for name in (together, apart):
            await put_rules(client, name, 3, user_rate="0.01/s:2")

        def purchases(name: str) -> list[Purchase]:
            return [Purchase(name, user, qty, rid) for user, rid, qty, _ in STORM]

        info = SkuInfo(together, 5, rules=rules)
        at_once = await asyncio.gather(
            *(reservations.reserve(p, info) for p in purchases(together))
        )
        info = SkuInfo(apart, 5, rules=rules)
        in_a_row = [await reservations.reserve(p, info) for p in purchases(apart)]
        expected = [kind for *_, kind in STORM]
        assert [r.kind for r in at_once] == [r.kind for r in in_a_row] == expected
        assert [r.exhausted for r in at_once] == [r.exhausted for r in in_a_row]
        for name in (together, apart):
            keys = SkuKeys.of(key_prefix, name)
            assert await redis_state(redis, key_prefix, name) == (0, 2)
            assert await redis.hgetall(keys.buyers) == {
                b"u1": b"r1",
                b"u3": b"r5",
            }

    async def test_a_call_sent_again_gets_its_first_replies_and_reserves_once(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """redis-py sends a command again after a timeout, and a cluster pipeline
        again whole when one node failed, even where the script already ran: the
        same call (same call key) gets the replies of its first run, so its
        purchases are not told "in_progress" by their own reservations."""
        client = await start_gateway()
        await put_rules(client, sku, 3)
        script = read_script("reserve")
        await script.load(redis)
        sku_keys = SkuKeys.of(key_prefix, sku)
        keys = [*sku_keys.all(), call_key(key_prefix, sku, "c1"), sku_keys.rebuild]
        # No limit group (0), and so no group keys past the last (index 7).
        head: list[str | int] = [60_000, "", "", 0, 0, 0, 0, 0, 7]
        entries: list[str | int] = ["r1", "u1", 1, 0, 0, 0, "r2", "u2", 1, 0, 0, 0]
        first = await script(redis, keys, [*head, *entries])
        again = await script(redis, keys, [*head, *entries])
        assert [r[0] for r in first] == [b"ok", b"ok"]
        assert again == first
        assert await redis_state(redis, key_prefix, sku) == (1, 2)
        # Another call of the same purchases is a replay, not the same call.
        keys[4] = call_key(key_prefix, sku, "c2")
        other = await script(redis, keys, [*head, *entries])
        assert [r[0] for r in other] == [b"in_progress", b"in_progress"]

    async def test_a_storm_of_one_turn_sells_exactly_the_stock_once_per_user(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str, database_url: str
    ) -> None:
        """600 purchases sent at once (200 users, each twice with its own request id
        and once replaying one of them) sell exactly 50: no oversell, no second
        order, every replay answered with its own request's outcome."""
        client = await start_gateway()
        await put_rules(client, sku, 50)
        calls = [buy(client, sku, f"user{i}", f"r{i}-{n}") for n in range(2) for i in range(200)]
        calls += [buy(client, sku, f"user{i}", f"r{i}-0") for i in range(200)]
        results = await asyncio.gather(*calls)
        statuses = collections.Counter(status for status, _ in results)
        assert not [s for s in statuses if s >= 500], statuses
        confirmed = {b["request_id"] for _, b in results if b.get("status") == "confirmed"}
        users = {b["user_id"] for _, b in results if b.get("status") == "confirmed"}
        assert len(confirmed) == len(users) == 50
        assert await db_state(database_url, sku) == (0, 50, 50)
        assert await redis_state(redis, key_prefix, sku) == (0, 0)


async def test_reserve_many_on_a_cluster_with_rate_limits(
    redis_cluster: LocalRedisCluster, start_gateway: Any, sku: str
) -> None:
    """On a Redis Cluster the skus of one turn go out as one call per sku, each in
    its slot with its users' and clients' buckets: four skus on the shards sell
    exactly their stock and the limits hold."""
    client = await start_gateway(
        redis_cluster_nodes=redis_cluster.startup_nodes, user_rate="0.01/s:2"
    )
    skus = [f"{sku}-{i}" for i in range(4)]
    for name in skus:
        await put_rules(client, name, 5, client_rate="1000/s:1000")
    attempts = [(name, f"u{i}", f"r{i}-{n}") for name in skus for i in range(8) for n in range(3)]
    results = await asyncio.gather(*(buy(client, *attempt) for attempt in attempts))
    by_sku: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for (status, body), (call_sku, _, _) in zip(results, attempts, strict=True):
        by_sku[call_sku][str(body.get("status") or body.get("error"))] += 1
        assert status < 500, body
    for name in skus:
        outcomes = by_sku[name]
        assert outcomes["confirmed"] == 5, outcomes
        # Each user's third attempt finds the bucket empty, unless the sku is gone.
        assert outcomes["rate_limited"] + outcomes["sold_out"] >= 8, outcomes
