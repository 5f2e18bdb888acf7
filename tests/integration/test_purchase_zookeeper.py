"""The gateway with ``GATEWAY_FLUSH_LOCK=zookeeper``: a storm sells exactly the stock,
the ZooKeeper fence reaches the same fenced UPDATE as the other families' (and is
refused by it when stale), and the lease rule's metrics are exported. Real Redis,
PostgreSQL and ZooKeeper."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from gateway.lock.zookeeper import FENCE_BASE
from testkit.purchases import buy, db_state, put_sku, redis_state
from testkit.zookeeper_servers import ZooKeeperServer

pytestmark = pytest.mark.timeout(120)


async def row_fence(database_url: str, sku: str) -> int:
    con = await asyncpg.connect(database_url)
    try:
        return int(await con.fetchval("SELECT fence FROM inventory WHERE sku = $1", sku))
    finally:
        await con.close()


async def set_row_fence(database_url: str, sku: str, fence: int) -> None:
    con = await asyncpg.connect(database_url)
    try:
        await con.execute("UPDATE inventory SET fence = $2 WHERE sku = $1", sku, fence)
    finally:
        await con.close()


class TestZooKeeperFlushLock:
    """Flushes under the ZooKeeper lock: exact sales, fenced by czxid."""

    async def test_a_storm_sells_exactly_the_stock_under_the_zookeeper_lock(
        self,
        start_gateway: Any,
        zookeeper_server: ZooKeeperServer,
        sku: str,
        database_url: str,
        redis: Redis,
        key_prefix: str,
    ) -> None:
        """1,000 users buying twice at once: 100 confirmed to distinct users, no 5xx,
        database and Redis at zero; the row's fence is a ZooKeeper token."""
        client = await start_gateway(flush_lock="zookeeper", zookeeper_hosts=zookeeper_server.hosts)
        await put_sku(client, sku, 100)
        calls = [buy(client, sku, f"user{i}", f"r{i}-{n}") for n in range(2) for i in range(1000)]
        results = await asyncio.gather(*calls)
        statuses = collections.Counter(status for status, _ in results)
        assert not [s for s in statuses if s >= 500], statuses
        confirmed = [b["user_id"] for _, b in results if b.get("status") == "confirmed"]
        assert len(confirmed) == len(set(confirmed)) == 100
        assert await db_state(database_url, sku) == (0, 100, 100)
        assert await redis_state(redis, key_prefix, sku) == (0, 0)
        assert await row_fence(database_url, sku) > FENCE_BASE
        metrics = await (await client.get("/metrics")).text()
        assert "flashsale_lock_lease_seconds 10.0" in metrics
        assert "flashsale_lock_hold_seconds_count" in metrics
        assert "flashsale_lock_hold_seconds_count 0.0" not in metrics

    async def test_a_sku_sold_under_the_redis_lock_goes_on_selling_under_zookeeper(
        self, start_gateway: Any, zookeeper_server: ZooKeeperServer, sku: str, database_url: str
    ) -> None:
        """The row holds a Redis (clock) token; ZooKeeper's tokens are above every such
        token, so switching families fences nobody out."""
        redis_gateway = await start_gateway(flush_lock="redis")
        await put_sku(redis_gateway, sku, 5)
        assert (await buy(redis_gateway, sku, "before"))[0] == 201
        clock_fence = await row_fence(database_url, sku)
        assert 0 < clock_fence < FENCE_BASE
        zk_gateway = await start_gateway(
            flush_lock="zookeeper", zookeeper_hosts=zookeeper_server.hosts
        )
        assert (await buy(zk_gateway, sku, "after"))[0] == 201
        assert await row_fence(database_url, sku) > FENCE_BASE
        assert await db_state(database_url, sku) == (3, 2, 2)

    async def test_a_stale_zookeeper_token_is_refused_by_the_fenced_update(
        self,
        start_gateway: Any,
        zookeeper_server: ZooKeeperServer,
        sku: str,
        database_url: str,
        redis: Redis,
        key_prefix: str,
    ) -> None:
        """The row carries a token newer than any czxid the ensemble will hand out soon:
        every flush is fenced out, the buyer gets 503, the reservation goes back and the
        stock is untouched."""
        client = await start_gateway(flush_lock="zookeeper", zookeeper_hosts=zookeeper_server.hosts)
        await put_sku(client, sku, 5)
        await set_row_fence(database_url, sku, FENCE_BASE + 2**50)
        status, body = await buy(client, sku, "stale", "s1")
        assert (status, body["error"]) == (503, "unavailable")
        assert await db_state(database_url, sku) == (5, 0, 0)
        assert await redis_state(redis, key_prefix, sku) == (5, 0)
        metrics = await (await client.get("/metrics")).text()
        assert "flashsale_fenced_out_total 0.0" not in metrics
