"""Sale windows and rate limits (issue 13), decided by reserve.lua against Redis
TIME, through an in-process gateway on real Redis and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS, buy, put_rules, redis_state


async def redis_now(redis: Redis) -> datetime:
    """Redis's clock: the one clock every window is decided against."""
    seconds, micros = await redis.time()
    return datetime.fromtimestamp(seconds + micros / 1e6, UTC)


def stamp(instant: datetime) -> str:
    """RFC 3339 as a client would send it."""
    return instant.isoformat()


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
            "waiting_room": False,
        }

    @pytest.mark.parametrize("strategy", ["reserve-batch", "sql-direct"])
    async def test_a_sale_far_off_caps_retry_after_at_a_day(
        self, start_gateway: Any, sku: str, strategy: str
    ) -> None:
        """A sale starting in 2099, decided in Redis or in PostgreSQL, answers
        not_started with its real start in the body and a Retry-After of 86400
        (a day), not the seventy-odd years to the start."""
        client = await start_gateway()
        await put_rules(client, sku, 5, starts_at="2099-01-01T00:00:00Z", strategy=strategy)
        status, body, retry_after = await post(client, sku, "u1", "r1")
        assert (status, body) == (
            409,
            {"status": "not_started", "starts_at": "2099-01-01T00:00:00.000Z"},
        )
        assert retry_after == "86400"

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
