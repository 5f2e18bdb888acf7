"""The per-sku strategy through a real gateway process, and the synchronous
strategies selling on while its Redis is down."""

from __future__ import annotations

from typing import Any

import aiohttp

from gateway.ops.audit import Finding, audit
from gateway.settings import Settings
from testkit.gateways import GatewayCluster
from testkit.purchases import counts
from testkit.redis_servers import RedisServer

REDIS_FREE = ("sql-direct", "optimistic", "pessimistic")


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None, token: str = ""
) -> tuple[int, Any]:
    """One JSON request, with the admin ``token`` if given; (status, JSON body)."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with http.request(method, url, json=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


class TestStrategyField:
    """PUT /admin/skus/{sku} takes "strategy"; GET /v1/skus/{sku} shows it; skus on
    the synchronous strategies need no Redis to sell."""

    async def test_synchronous_skus_sell_on_with_redis_down(
        self, database_url: str, key_prefix: str, sku: str
    ) -> None:
        """A gateway process with one sku per strategy: each PUT answers its
        strategy and GET /v1/skus shows it, a bogus strategy is a 400. Then its
        Redis stops: the reserve-batch sku answers 503, while each synchronous
        sku sells its two units, replays, refuses a duplicate and sells out, and
        its audit (which needs no Redis for it) is clean."""
        timeout = aiohttp.ClientTimeout(total=15)
        async with (
            RedisServer() as redis_server,
            GatewayCluster(
                1,
                redis_url=redis_server.url(),
                database_url=database_url,
                key_prefix=key_prefix,
            ) as cluster,
            aiohttp.ClientSession(timeout=timeout) as http,
        ):
            url = cluster.urls[0]
            for strategy in (*REDIS_FREE, "reserve-batch"):
                body = {"stock": 2, "strategy": strategy}
                status, put = await call(
                    http, "PUT", f"{url}/admin/skus/{sku}-{strategy}", body, cluster.admin_token
                )
                assert status == 200, put
                assert put["strategy"] == strategy, put
                shown = await call(http, "GET", f"{url}/v1/skus/{sku}-{strategy}")
                assert shown == (
                    200,
                    {
                        "sku": f"{sku}-{strategy}",
                        "available": 2,
                        "strategy": strategy,
                        "starts_at": None,
                        "ends_at": None,
                        "waiting_room": False,
                    },
                )
            status, bad = await call(
                http,
                "PUT",
                f"{url}/admin/skus/{sku}-x",
                {"stock": 1, "strategy": "bogus"},
                cluster.admin_token,
            )
            assert (status, bad["error"]) == (400, "invalid_request")

            await redis_server.stop()

            def purchase(s: str, user: str, rid: str) -> dict[str, str]:
                return {"sku": s, "user_id": user, "request_id": f"{s}.{rid}"}

            status, body = await call(
                http, "POST", f"{url}/v1/purchase", purchase(f"{sku}-reserve-batch", "a", "1")
            )
            assert (status, body["error"]) == (503, "unavailable")
            for strategy in REDIS_FREE:
                s = f"{sku}-{strategy}"
                status, alice = await call(
                    http, "POST", f"{url}/v1/purchase", purchase(s, "alice", "a")
                )
                assert status == 201, alice
                assert await call(
                    http, "POST", f"{url}/v1/purchase", purchase(s, "alice", "a")
                ) == (
                    201,
                    alice,
                )
                assert await call(
                    http, "POST", f"{url}/v1/purchase", purchase(s, "alice", "a2")
                ) == (
                    409,
                    {"status": "duplicate"},
                )
                assert (await call(http, "POST", f"{url}/v1/purchase", purchase(s, "bob", "b")))[
                    0
                ] == 201
                assert await call(
                    http, "POST", f"{url}/v1/purchase", purchase(s, "carol", "c")
                ) == (
                    409,
                    {"status": "sold_out"},
                )
                assert await call(http, "GET", f"{url}/v1/skus/{s}") == (
                    200,
                    {
                        "sku": s,
                        "available": 0,
                        "strategy": strategy,
                        "starts_at": None,
                        "ends_at": None,
                        "waiting_room": False,
                    },
                )
                status, report = await call(
                    http, "GET", f"{url}/admin/skus/{s}", None, cluster.admin_token
                )
                assert (status, counts(report)) == (
                    200,
                    {"db_stock": 0, "redis_stock": None, "pending": 0, "sold": 2},
                )
                settings = Settings(
                    database_url=database_url, redis_url=redis_server.url(), key_prefix=key_prefix
                )
                [row] = await audit(settings, s)
                assert (row.sold, row.db_stock, row.verdict) == (2, 0, Finding.OK)


class TestLimitsWithRedisDown:
    """The window and rate limits of the strategies without Redis state are
    PostgreSQL's (issue 19): they hold while Redis is down."""

    async def test_rate_limit_and_window_hold_with_redis_stopped(
        self, database_url: str, key_prefix: str, sku: str
    ) -> None:
        """A gateway process whose Redis is stopped: an optimistic sku with a user
        rate of one per 100 s sells once, then answers 429; one whose sale starts
        in an hour answers 409 not_started."""
        async with (
            RedisServer() as redis_server,
            GatewayCluster(
                1, redis_url=redis_server.url(), database_url=database_url, key_prefix=key_prefix
            ) as cluster,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http,
        ):
            url, token = cluster.urls[0], cluster.admin_token
            limited = {"stock": 5, "strategy": "optimistic", "user_rate": "0.01/s:1"}
            later = {"stock": 5, "strategy": "optimistic", "starts_at": "2999-01-01T00:00:00Z"}
            assert (await call(http, "PUT", f"{url}/admin/skus/{sku}-r", limited, token))[0] == 200
            assert (await call(http, "PUT", f"{url}/admin/skus/{sku}-w", later, token))[0] == 200
            await redis_server.stop()
            buy = {"sku": f"{sku}-r", "user_id": "u1"}
            status, first = await call(
                http, "POST", f"{url}/v1/purchase", {**buy, "request_id": f"{sku}.a"}
            )
            assert status == 201, first
            again = await call(
                http, "POST", f"{url}/v1/purchase", {**buy, "request_id": f"{sku}.b"}
            )
            assert again == (429, {"error": "rate_limited"})
            early = {"sku": f"{sku}-w", "user_id": "u1", "request_id": f"{sku}.c"}
            status, body = await call(http, "POST", f"{url}/v1/purchase", early)
            assert (status, body["status"]) == (409, "not_started"), body
