"""Sale windows and rate limits (issue 13), decided by reserve.lua against Redis
TIME, through an in-process gateway on real Redis and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from gateway.postgres.database import migrate
from testkit.migrations import migrated_before
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


# Instants a window must refuse: before year 1 or past 9999 once the offset is
# applied, and inside Python's range but before 2000.
OUT_OF_RANGE = (
    "0001-01-01T00:00:00Z",
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-01:00",
    "1999-12-31T23:59:59Z",
)


class TestWindowRange:
    """Issue 38: an instant no layer can hold never enters, so a sku is never
    broken for good by its own window."""

    @pytest.mark.parametrize("instant", OUT_OF_RANGE)
    @pytest.mark.parametrize("field", ["starts_at", "ends_at"])
    async def test_put_and_patch_refuse_it_and_the_sku_sells_on(
        self, start_gateway: Any, sku: str, field: str, instant: str
    ) -> None:
        """A PUT creating the sku with it, and a PATCH of a sku on sale: 400
        invalid_request naming the range (not a 200 that breaks every later
        read, not a 503 a client retries forever); nothing is created or
        changed, and the sku answers and sells as before."""
        client = await start_gateway()
        resp = await client.put(
            f"/admin/skus/{sku}", json={"stock": 5, field: instant}, headers=ADMIN_HEADERS
        )
        body = await resp.json()
        assert (resp.status, body["error"]) == (400, "invalid_request"), body
        assert "2000-01-01T00:00:00Z" in body["detail"]
        assert (await client.get(f"/v1/skus/{sku}")).status == 404
        await put_rules(client, sku, 5)
        resp = await client.patch(
            f"/admin/skus/{sku}", json={"stock": 7, field: instant}, headers=ADMIN_HEADERS
        )
        assert (resp.status, (await resp.json())["error"]) == (400, "invalid_request")
        resp = await client.get(f"/v1/skus/{sku}")
        assert resp.status == 200 and (await resp.json())["available"] == 5
        status, _ = await buy(client, sku, "amy", f"{sku}.a")
        assert status == 201

    async def test_the_database_refuses_it_to_any_writer(self, con: Any, sku: str) -> None:
        """The floor under the door: a window out of range written by SQL by hand
        fails the inventory's CHECK."""
        # Stock 0: a row with no movement behind it, balanced for the audits of
        # the tests that audit every sku of the session's database.
        await con.execute("INSERT INTO inventory (sku, stock) VALUES ($1, 0)", sku)
        for column in ("starts_at", "ends_at"):
            for value in OUT_OF_RANGE:
                with pytest.raises(asyncpg.CheckViolationError):
                    await con.execute(
                        f"UPDATE inventory SET {column} = $2::text::timestamptz WHERE sku = $1",
                        sku,
                        value,
                    )

    async def test_the_migration_keeps_each_stored_window_meaning(self, tmp_path: Path) -> None:
        """Windows stored out of range before 014 are brought in range with their
        meaning kept: a start long ago is no start, an end long ago an end at
        2000 (still ended), an end past 9999 no end; each is readable after."""
        async with migrated_before("014", tmp_path) as con:
            await con.execute(
                "INSERT INTO inventory (sku, stock, starts_at, ends_at) VALUES"
                " ('old', 1, '0001-01-01Z', '0001-06-01Z'),"
                " ('far', 1, '2026-01-01Z', '10000-01-01T00:30:00Z')"
            )
            assert "014_window_range" in await migrate(con)
            rows = await con.fetch("SELECT sku, starts_at, ends_at FROM inventory ORDER BY sku")
        assert [tuple(r) for r in rows] == [
            ("far", datetime(2026, 1, 1, tzinfo=UTC), None),
            ("old", None, datetime(2000, 1, 1, tzinfo=UTC)),
        ]


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
