"""Sale windows and rate limits (issue 13), decided by reserve.lua against Redis
TIME, through an in-process gateway on real Redis and PostgreSQL."""

from __future__ import annotations

import asyncio
import collections
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.appkeys import INVENTORY
from gateway.domain import Purchase, SkuInfo
from gateway.layout import SkuKeys, call_key
from gateway.rules import Rate, SaleRules
from gateway.scripts import read_script
from tests.support.polling import wait_for
from tests.support.purchases import ADMIN_HEADERS, buy, db_state, redis_state
from tests.support.redis_cluster import LocalRedisCluster


async def redis_now(redis: Redis) -> datetime:
    """Redis's clock: the one clock every window is decided against."""
    seconds, micros = await redis.time()
    return datetime.fromtimestamp(seconds + micros / 1e6, UTC)


def stamp(instant: datetime) -> str:
    """RFC 3339 as a client would send it."""
    return instant.isoformat()


async def put_rules(client: Any, sku: str, stock: int, **rules: Any) -> dict[str, Any]:
    """PUT the sku with ``rules`` (starts_at, ends_at, user_rate, client_rate); asserts 200."""
    resp = await client.put(
        f"/admin/skus/{sku}", json={"stock": stock, **rules}, headers=ADMIN_HEADERS
    )
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def post(
    client: Any, sku: str, user: str, rid: str, forwarded_for: str | None = None
) -> tuple[int, dict[str, Any], str | None]:
    """A purchase, optionally through a trusted proxy; (status, body, Retry-After)."""
    headers = {} if forwarded_for is None else {"X-Forwarded-For": forwarded_for}
    body = {"sku": sku, "user_id": user, "request_id": f"{sku}.{rid}"}
    resp = await client.post("/v1/purchase", json=body, headers=headers)
    return resp.status, await resp.json(), resp.headers.get("Retry-After")


class TestSaleWindow:
    """Before the window a purchase is told when to come back; after it, that it ended."""

    async def test_before_the_start_not_started_with_retry_after_and_no_stock_taken(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """A sale starting in 100 s (by Redis's clock) answers 409 not_started with
        its start and a Retry-After of about 100 s, takes nothing, and GET shows the window."""
        client = await start_gateway()
        starts = await redis_now(redis) + timedelta(seconds=100)
        ends = starts + timedelta(hours=1)
        await put_rules(client, sku, 5, starts_at=stamp(starts), ends_at=stamp(ends))
        status, body, retry_after = await post(client, sku, "u1", "r1")
        shown = starts.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        assert (status, body) == (409, {"status": "not_started", "starts_at": shown})
        assert retry_after is not None and 99 <= int(retry_after) <= 100
        assert await redis_state(redis, key_prefix, sku) == (5, 0)
        view = await (await client.get(f"/v1/skus/{sku}")).json()
        assert view == {
            "sku": sku,
            "strategy": "reserve-batch",
            "available": 5,
            "starts_at": shown,
            "ends_at": ends.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }

    async def test_after_the_end_ended_but_a_confirmed_replay_keeps_its_order(
        self, start_gateway: Any, sku: str, redis: Redis
    ) -> None:
        """Once the window closed a new purchase gets 409 ended; the replay of an
        order made while it was open still gets its 201."""
        client = await start_gateway()
        now = await redis_now(redis)
        await put_rules(client, sku, 5, starts_at=stamp(now - timedelta(seconds=60)))
        status, bought = await buy(client, sku, "u1", "r1")
        assert status == 201
        await put_rules(client, sku, 4, ends_at=stamp(now - timedelta(seconds=1)))
        status, body, _ = await post(client, sku, "u2", "r2")
        assert (status, body) == (409, {"status": "ended"})
        assert await buy(client, sku, "u1", "r1") == (201, bought)

    async def test_the_sale_opens_at_the_start_by_redis_time(
        self, start_gateway: Any, sku: str, redis: Redis
    ) -> None:
        """A sale starting 1.5 s from now by Redis's clock refuses until then and
        sells from then on: the boundary is Redis TIME (the script gets no clock
        from the gateway)."""
        client = await start_gateway()
        starts = await redis_now(redis) + timedelta(seconds=1.5)
        await put_rules(client, sku, 1, starts_at=stamp(starts))
        assert (await post(client, sku, "u1", "early"))[:2] == (
            409,
            {
                "status": "not_started",
                "starts_at": starts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            },
        )
        attempts = 0

        async def sold() -> bool:
            nonlocal attempts
            attempts += 1
            status, _, _ = await post(client, sku, "u1", f"try{attempts}")
            if status == 201:
                return True
            assert await redis_now(redis) < starts, "refused after the start"
            return False

        await wait_for(sold, within=10, what="the sale to open")
        assert await redis_now(redis) >= starts

    @pytest.mark.parametrize(
        ("rules", "detail"),
        [
            ({"starts_at": "2030-01-02T00:00:00Z", "ends_at": "2030-01-01T00:00:00Z"}, "after"),
            ({"starts_at": "2030-01-01T00:00:00Z", "ends_at": "2030-01-01T00:00:00Z"}, "after"),
            ({"starts_at": "2030-01-01T00:00:00"}, "RFC 3339"),
            ({"starts_at": "tomorrow"}, "RFC 3339"),
            ({"ends_at": 1893456000}, "RFC 3339"),
            ({"user_rate": "5 per second"}, "N/s:burst"),
            ({"client_rate": "0/s:1"}, "positive"),
        ],
    )
    async def test_a_bad_window_or_rate_is_a_400(
        self, start_gateway: Any, sku: str, rules: dict[str, Any], detail: str
    ) -> None:
        """An invalid time, a window ending at or before its start and a malformed
        rate are 400 invalid_request naming the problem; nothing is created."""
        client = await start_gateway()
        resp = await client.put(
            f"/admin/skus/{sku}", json={"stock": 1, **rules}, headers=ADMIN_HEADERS
        )
        body = await resp.json()
        assert resp.status == 400 and body["error"] == "invalid_request", body
        assert detail in body["detail"]
        assert (await client.get(f"/v1/skus/{sku}")).status == 404


class TestRateLimits:
    """Token buckets per user and per client address, per sku."""

    async def test_a_user_over_the_limit_gets_429_and_others_and_replays_do_not(
        self, start_gateway: Any, sku: str
    ) -> None:
        """With a sku's user_rate of 0.01/s:2 a user's third attempt is 429
        rate_limited with Retry-After (about 100 s, the time to one token); another
        user still buys, and the replay of the first user's order still gets it."""
        client = await start_gateway()
        await put_rules(client, sku, 10, user_rate="0.01/s:2")
        status, first, _ = await post(client, sku, "u1", "r1")
        assert status == 201
        assert (await post(client, sku, "u1", "r2"))[:2] == (409, {"status": "duplicate"})
        status, body, retry_after = await post(client, sku, "u1", "r3")
        assert (status, body) == (429, {"error": "rate_limited"})
        assert retry_after is not None and 99 <= int(retry_after) <= 100
        assert (await post(client, sku, "u2", "r4"))[0] == 201
        assert (await post(client, sku, "u1", "r1"))[:2] == (201, first)

    async def test_a_client_address_over_the_limit_gets_429_per_forwarded_address(
        self, start_gateway: Any, sku: str
    ) -> None:
        """Behind a trusted proxy the client is the X-Forwarded-For address: three
        users from one address share its bucket (0.01/s:2), the third is 429; a user
        from another address buys."""
        client = await start_gateway(trusted_proxies="127.0.0.1/32")
        await put_rules(client, sku, 10, client_rate="0.01/s:2")
        same = "203.0.113.7"
        assert (await post(client, sku, "u1", "r1", same))[0] == 201
        assert (await post(client, sku, "u2", "r2", same))[0] == 201
        status, body, retry_after = await post(client, sku, "u3", "r3", same)
        assert (status, body) == (429, {"error": "rate_limited"}) and retry_after
        assert (await post(client, sku, "u3", "r4", "203.0.113.8"))[0] == 201

    async def test_the_instance_default_applies_and_a_sku_can_override_or_switch_it_off(
        self, start_gateway: Any, sku: str
    ) -> None:
        """GATEWAY_USER_RATE=0.01/s:1 limits a sku without rules of its own (second
        attempt 429); a sku with "off" is not limited; one with 0.01/s:3 allows three."""
        client = await start_gateway(user_rate="0.01/s:1")
        plain, off, roomy = f"{sku}-plain", f"{sku}-off", f"{sku}-roomy"
        await put_rules(client, plain, 10)
        await put_rules(client, off, 10, user_rate="off")
        await put_rules(client, roomy, 10, user_rate="0.01/s:3")
        assert (await post(client, plain, "u", "1"))[0] == 201
        assert (await post(client, plain, "u", "2"))[0] == 429
        statuses = [(await post(client, off, "u", str(i)))[0] for i in range(5)]
        assert statuses == [201, 409, 409, 409, 409]
        statuses = [(await post(client, roomy, "u", str(i)))[0] for i in range(4)]
        assert statuses == [201, 409, 409, 429]

    async def test_sold_out_beats_rate_limited(
        self, start_gateway: Any, sku: str, redis: Redis
    ) -> None:
        """A limited user on a sku with nothing left is told sold_out, not asked
        to come back for stock that is gone."""
        client = await start_gateway()
        await put_rules(client, sku, 1, user_rate="0.01/s:1")
        assert (await post(client, sku, "a", "r1"))[0] == 201
        assert (await post(client, sku, "a", "r2"))[:2] == (409, {"status": "sold_out"})


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
        inventory = client.app[INVENTORY]
        together, apart = f"{sku}-together", f"{sku}-apart"
        rules = SaleRules(user_rate=Rate(0.01, 2))
        for name in (together, apart):
            await put_rules(client, name, 3, user_rate="0.01/s:2")

        def purchases(name: str) -> list[Purchase]:
            return [Purchase(name, user, qty, rid) for user, rid, qty, _ in STORM]

        info = SkuInfo(together, 5, rules=rules)
        at_once = await asyncio.gather(*(inventory.reserve(p, info) for p in purchases(together)))
        info = SkuInfo(apart, 5, rules=rules)
        in_a_row = [await inventory.reserve(p, info) for p in purchases(apart)]
        expected = [kind for *_, kind in STORM]
        assert [r.kind for r in at_once] == [r.kind for r in in_a_row] == expected
        assert [r.settled for r in at_once] == [r.settled for r in in_a_row]
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
        keys = [*SkuKeys.of(key_prefix, sku).all(), call_key(key_prefix, sku, "c1")]
        head: list[str | int] = [60_000, "", "", 0, 0, 0, 0]
        entries: list[str | int] = ["r1", "u1", 1, 0, 0, "r2", "u2", 1, 0, 0]
        first = await script(redis, keys, [*head, *entries])
        again = await script(redis, keys, [*head, *entries])
        assert [r[0] for r in first] == [b"ok", b"ok"]
        assert again == first
        assert await redis_state(redis, key_prefix, sku) == (1, 2)
        # Another call of the same purchases is a replay, not the same call.
        keys[-1] = call_key(key_prefix, sku, "c2")
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
