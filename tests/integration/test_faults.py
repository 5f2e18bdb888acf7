"""Failures on the purchase path: lost scripts, lost keys, Redis ahead of the
database, PostgreSQL unreachable, and two gateways on one Redis and database."""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis

from gateway.app import create_app
from gateway.postgres.database import migration_versions
from gateway.redis.layout import SkuKeys
from gateway.settings import Misconfigured
from testkit.polling import wait_for
from testkit.ports import free_port
from testkit.proxy import FaultProxy
from testkit.purchases import ADMIN_HEADERS, buy, counts, db_state, put_sku, redis_state
from testkit.services import PG_ADMIN_URL, create_database, drop_database


async def sale(
    client: Any, sku: str, users: range | list[str], tag: str
) -> collections.Counter[Any]:
    """Every user buys once at the same time; counts statuses and outcomes."""
    names = [f"u{u}" if isinstance(u, int) else u for u in users]
    results = await asyncio.gather(*(buy(client, sku, n, f"{tag}-{n}") for n in names))
    counts: collections.Counter[Any] = collections.Counter()
    for status, body in results:
        counts[status] += 1
        counts[body.get("status") or body.get("error")] += 1
    return counts


class TestScriptsAndKeys:
    """Redis forgetting scripts or keys never oversells nor loses stock."""

    async def test_noscript_after_script_flush_reloads(
        self, start_gateway: Any, sku: str, redis: Redis
    ) -> None:
        """After SCRIPT FLUSH the next purchase reloads the script and succeeds."""
        client = await start_gateway()
        await put_sku(client, sku, 3)
        assert (await buy(client, sku, "a"))[0] == 201
        await redis.script_flush()
        assert (await buy(client, sku, "b"))[0] == 201
        assert (await buy(client, sku, "c"))[0] == 201

    async def test_keys_deleted_mid_sale(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str, database_url: str
    ) -> None:
        """Deleting the sku's keys while 300 users buy 100 units: no oversell, no
        duplicate user, and a second wave sells exactly what is left."""
        client = await start_gateway()
        await put_sku(client, sku, 100)
        keys = SkuKeys.of(key_prefix, sku).all()

        async def vandal() -> None:
            for _ in range(5):
                await asyncio.sleep(0.01)
                await redis.delete(*keys)

        first, _ = await asyncio.gather(sale(client, sku, range(300), "w1"), vandal())
        # A key lost again between the reload and the retry is a 503, never a 500.
        assert not [s for s in first if isinstance(s, int) and s >= 500 and s != 503], first
        stock, orders, users = await db_state(database_url, sku)
        assert orders == users == first["confirmed"] <= 100
        assert stock == 100 - orders
        second = await sale(client, sku, range(300, 600), "w2")
        stock, orders, users = await db_state(database_url, sku)
        assert (stock, orders, users) == (0, 100, 100), (first, second)
        assert await redis_state(redis, key_prefix, sku) == (0, 0)

    async def test_replay_after_redis_lost_everything(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """With every key of the sku gone (Redis restarted empty), a replay of a
        confirmed request still gets its order, the same buyer with a new request
        is a duplicate, and the rest of the stock still sells."""
        client = await start_gateway()
        await put_sku(client, sku, 2)
        status, first = await buy(client, sku, "alice", "a1")
        assert status == 201
        await redis.delete(*SkuKeys.of(key_prefix, sku).all())
        assert await buy(client, sku, "alice", "a1") == (201, first)
        assert await buy(client, sku, "alice", "a2") == (409, {"status": "duplicate"})
        assert (await buy(client, sku, "bob", "b1"))[0] == 201
        assert await buy(client, sku, "carol", "c1") == (409, {"status": "sold_out"})

    async def test_redis_stock_above_database_is_split(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str, database_url: str
    ) -> None:
        """Redis raised by hand to 50 over a database stock of 5: 5 confirmed,
        45 sold_out, and Redis brought back down to the database's count."""
        client = await start_gateway()
        await put_sku(client, sku, 5)
        await redis.set(SkuKeys.of(key_prefix, sku).stock, 50)
        counts = await sale(client, sku, range(50), "split")
        assert (counts["confirmed"], counts["sold_out"]) == (5, 45), counts
        assert await db_state(database_url, sku) == (0, 5, 5)
        assert await redis_state(redis, key_prefix, sku) == (0, 0)


@pytest.fixture
async def outage(database_url: str) -> AsyncIterator[Any]:
    """Switches the test database off and on for every client, superusers too."""
    name = database_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(PG_ADMIN_URL)

    async def set_reachable(reachable: bool) -> None:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(reachable).lower()}')
        if not reachable:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name
            )

    try:
        yield set_reachable
    finally:
        await set_reachable(True)
        await admin.close()


class TestPostgresDown:
    """PostgreSQL unreachable: 503 with Retry-After, and every reservation given
    back: at once when the flush never reached PostgreSQL, by the reconciler when
    the connection broke under it (it may have committed). Which of the two an
    outage hits is up to timing; test_outcome_unknown.py pins the second."""

    async def test_unreachable_database_answers_503_and_gives_stock_back(
        self,
        start_gateway: Any,
        sku: str,
        redis: Redis,
        key_prefix: str,
        outage: Any,
        database_url: str,
    ) -> None:
        """While the database refuses connections purchases get 503; once it is
        back and the reconciler has run, Redis stock and the buyers are restored,
        so the same users (same request ids) can buy."""
        client = await start_gateway(reservation_timeout_s=0.1, reconcile_interval_s=3600)
        await put_sku(client, sku, 10)
        await outage(False)
        results = await asyncio.gather(*(buy(client, sku, f"u{i}", f"r{i}") for i in range(5)))
        assert {status for status, _ in results} == {503}
        assert all(
            body == {"error": "unavailable", "detail": body["detail"]} for _, body in results
        )
        resp = await client.post("/v1/purchase", json={"sku": sku, "user_id": "x"})
        assert resp.headers.get("Retry-After")
        ready = await client.get("/readyz")
        assert ready.status == 503
        await outage(True)

        async def restored() -> bool:
            if await redis_state(redis, key_prefix, sku) == (10, 0):
                return True
            await client.post("/admin/reconcile", headers=ADMIN_HEADERS)
            return False

        await wait_for(restored, within=10, what="stock and buyers restored by reconciliation")
        results = await asyncio.gather(*(buy(client, sku, f"u{i}", f"r{i}") for i in range(5)))
        assert {status for status, _ in results} == {201}
        assert await db_state(database_url, sku) == (5, 5, 5)


class TestTwoInstances:
    """Two gateways on one fresh database and one Redis, started at the same moment."""

    async def test_started_together_share_the_sale(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """Both apply migrations safely (advisory lock) and together sell exactly
        the stock, each user once, whichever instance they hit."""
        name = f"flashsale_two_{uuid.uuid4().hex[:8]}"
        url = await create_database(name)
        try:
            a, b = await asyncio.gather(
                start_gateway(database_url=url), start_gateway(database_url=url)
            )
            await put_sku(a, sku, 50)
            calls = [buy((a, b)[i % 2], sku, f"u{i // 2}", f"r{i}") for i in range(400)]
            results = await asyncio.gather(*calls)
            outcomes = collections.Counter(body.get("status") for _, body in results)
            assert outcomes["confirmed"] == 50, outcomes
            assert outcomes["sold_out"] + outcomes["duplicate"] == 350
            assert await db_state(url, sku) == (0, 50, 50)
            con = await asyncpg.connect(url)
            versions = await con.fetch("SELECT version FROM schema_migrations")
            await con.close()
            assert [r["version"] for r in versions] == [v for v, _ in migration_versions()]
            report = await (await b.get(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)).json()
            assert counts(report) == {"db_stock": 0, "redis_stock": 0, "pending": 0, "sold": 50}
        finally:
            for client in (a, b):
                await client.close()
            await drop_database(name)


class TestBounds:
    """A burst beyond every pool queues or is shed; it never fails for want of connections."""

    async def test_thousand_concurrent_requests_on_tiny_pools(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """1,000 purchases at once through 4 Redis and 2 PostgreSQL connections and a
        queue of 200: every answer is 201, 409 or 503 with Retry-After, none a 500,
        and exactly the stock is sold."""
        client = await start_gateway(redis_pool_size=4, db_pool_size=2, backlog_max=200)
        await put_sku(client, sku, 300)
        url = client.make_url("/v1/purchase")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

            async def one(i: int) -> tuple[int, str | None]:
                body = {"sku": sku, "user_id": f"b{i}", "request_id": f"{sku}.b{i}"}
                async with http.post(url, json=body) as resp:
                    await resp.read()
                    return resp.status, resp.headers.get("Retry-After")

            answers = await asyncio.gather(*(one(i) for i in range(1000)))
        statuses = collections.Counter(status for status, _ in answers)
        assert set(statuses) <= {201, 409, 503}, statuses
        assert all(retry for status, retry in answers if status == 503)
        stock, orders, _ = await db_state(database_url, sku)
        assert orders == statuses[201] and stock == 300 - orders


class TestStartup:
    """A gateway started while PostgreSQL is down waits for it, within a bound."""

    async def test_waits_for_the_database_to_come_up(
        self, make_settings: Any, database_url: str
    ) -> None:
        """Nothing listens on the database port at first; when a listener appears
        half a second later the gateway finishes starting and serves."""
        port = free_port()
        url = database_url.replace("127.0.0.1:5432", f"127.0.0.1:{port}")
        client = TestClient(
            TestServer(create_app(make_settings(database_url=url, startup_wait_s=20)))
        )
        starting = asyncio.create_task(client.start_server())
        await asyncio.sleep(0.5)
        assert not starting.done()
        with FaultProxy("127.0.0.1", 5432, listen_port=port):
            await asyncio.wait_for(starting, 20)
            try:
                assert (await client.get("/readyz")).status == 200
            finally:
                await client.close()

    async def test_waits_for_redis_to_come_up(self, make_settings: Any) -> None:
        """The same for Redis: nothing listens on its port at first; when a
        listener appears half a second later the gateway finishes starting."""
        port = free_port()
        client = TestClient(
            TestServer(
                create_app(
                    make_settings(redis_url=f"redis://127.0.0.1:{port}/0", startup_wait_s=20)
                )
            )
        )
        starting = asyncio.create_task(client.start_server())
        await asyncio.sleep(0.5)
        assert not starting.done()
        with FaultProxy("127.0.0.1", 6379, listen_port=port):
            await asyncio.wait_for(starting, 20)
            try:
                assert (await client.get("/readyz")).status == 200
            finally:
                await client.close()

    async def test_gives_up_after_the_bound(self, make_settings: Any, database_url: str) -> None:
        """With no database at all, start-up fails once the wait runs out, saying
        that nothing answers at the setting's address."""
        port = free_port()
        url = database_url.replace("127.0.0.1:5432", f"127.0.0.1:{port}")
        client = TestClient(
            TestServer(create_app(make_settings(database_url=url, startup_wait_s=0.5)))
        )
        with pytest.raises(Misconfigured, match=f"nothing answers at 127.0.0.1:{port}"):
            await asyncio.wait_for(client.start_server(), 20)
        await client.close()


class TestRedisDown:
    """Redis unreachable: purchases and admin changes answer 503, never 500."""

    async def test_everything_answers_503(self, start_gateway: Any, sku: str) -> None:
        """With the only way to Redis gone, a purchase, a stock reset and the
        readiness check all report the outage as 503 with a JSON body."""
        proxy = FaultProxy("127.0.0.1", 6379).start()
        try:
            client = await start_gateway(redis_url=f"redis://127.0.0.1:{proxy.port}/0")
            await put_sku(client, sku, 5)
        finally:
            proxy.stop()
        resp = await client.post("/v1/purchase", json={"sku": sku, "user_id": "r"})
        assert (resp.status, (await resp.json())["error"]) == (503, "unavailable")
        resp = await client.put(f"/admin/skus/{sku}", json={"stock": 9}, headers=ADMIN_HEADERS)
        assert (resp.status, (await resp.json())["error"]) == (503, "unavailable")
        assert (await client.get("/readyz")).status == 503
