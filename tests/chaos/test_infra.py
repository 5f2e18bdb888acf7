"""Self-tests of the chaos infrastructure: each tool does what the scenarios will rely on.

A scenario that passes because its fault never happened proves nothing, so
each fault is shown here to have a measurable effect: a failover elects a new
primary, latency costs time, a stall holds and releases, a cut and a black
hole break connections, PostgreSQL comes back after restarts, and a real
two-gateway sale through the proxies passes the invariants.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from testkit.driver import LoadDriver
from testkit.gateways import GatewayCluster
from testkit.invariants import check_invariants
from testkit.polling import wait_for
from testkit.postgres_servers import PostgresCluster
from testkit.proxy import FaultProxy
from testkit.redis_servers import RedisServer, command, redis_client
from testkit.sentinels import RedisSentinelCluster
from tests.chaos.reporting import Diagnostics

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(90)]


@pytest.fixture
async def proxy(redis_server: RedisServer) -> AsyncIterator[FaultProxy]:
    """A fault proxy in front of a private Redis."""
    with FaultProxy(*redis_server.address, name="redis") as running:
        yield running


async def test_redis_server_restart_comes_back_empty_and_pause_blocks(
    redis_server: RedisServer,
) -> None:
    """kill + restart keeps the port and loses the data (no persistence); SIGSTOP
    makes commands time out and SIGCONT lets them through again."""
    async with redis_server.client() as r:
        await r.set("k", "v")
    pid = redis_server.pid
    await redis_server.kill()
    assert not redis_server.running
    await redis_server.restart()
    assert redis_server.pid != pid
    async with redis_server.client() as r:
        assert await r.get("k") is None
    redis_server.pause()
    try:
        async with redis_server.client(within=0.3) as r:
            with pytest.raises((RedisTimeoutError, RedisConnectionError)):
                await r.ping()
    finally:
        redis_server.resume()
    async with redis_server.client() as r:
        assert await r.ping()


async def test_sentinel_fails_over_after_primary_is_killed(
    sentinel_cluster: RedisSentinelCluster,
) -> None:
    """SIGKILL of the primary makes a majority of Sentinels promote the replica,
    which then has the master role, kept the replicated data, and takes writes."""
    old_primary = await sentinel_cluster.primary()
    async with old_primary.client() as r:
        await r.set("before", "1")
        # WAIT: the write reached the replica, so losing it would be a real loss.
        assert await command(r, "WAIT", 1, 2000) == 1
    old = await sentinel_cluster.kill_primary()
    started = time.monotonic()
    new = await sentinel_cluster.wait_for_failover(within=20)
    took = time.monotonic() - started
    assert new != old

    async def all_agree() -> bool:
        # The majority decided; the last Sentinel learns it from hello messages.
        return {await s.master_address() for s in sentinel_cluster.sentinels} == {new}

    await wait_for(all_agree, within=10, what="every sentinel names the new primary")
    promoted = sentinel_cluster.node_at(new)
    assert await promoted.role() == "master"
    async with promoted.client() as r:
        assert await r.get("before") == "1"
        assert await r.set("after", "2")
        assert await r.get("after") == "2"
    assert len(sentinel_cluster.sentinel_addresses()) == 3
    # down-after 500 ms: a failover slower than this means the fixture is misconfigured.
    assert took < 15, f"failover took {took:.1f}s"


async def test_proxy_adds_latency_and_keeps_order(proxy: FaultProxy) -> None:
    """100 ms each way makes a PING round trip take >= 200 ms (one-way >= 90 ms),
    and with jitter a pipeline of 200 INCRs still answers 1..200 in order."""
    async with redis_client(proxy.address, within=5) as r:
        await r.ping()  # connection and handshake outside the measurement
        proxy.set_latency(100)
        started = time.monotonic()
        await r.ping()
        round_trip = time.monotonic() - started
        assert round_trip >= 0.19, f"round trip {round_trip * 1000:.0f} ms"
        proxy.set_latency(5, jitter_ms=40)
        pipe = r.pipeline(transaction=False)
        for _ in range(200):
            pipe.incr("counter")
        assert await pipe.execute() == list(range(1, 201))
        proxy.clear()
        started = time.monotonic()
        await r.ping()
        assert time.monotonic() - started < 0.15


async def test_proxy_stall_holds_then_releases(proxy: FaultProxy) -> None:
    """During a stall a command gets no answer yet the connection stays open;
    unstall delivers the answer on the same connection (same CLIENT ID)."""
    async with redis_client(proxy.address, within=5) as r:
        client_id = await r.client_id()
        proxy.stall()
        pending = asyncio.ensure_future(r.ping())
        try:
            await asyncio.sleep(0.3)
            assert not pending.done()
            assert proxy.active() == 1
        finally:
            proxy.unstall()
        assert await asyncio.wait_for(pending, 2)
        assert await r.client_id() == client_id


async def test_proxy_cut_drops_connections(proxy: FaultProxy) -> None:
    """cut() aborts open connections: the next command on one fails with a
    connection error; a new connection works."""
    async with redis_client(proxy.address) as r:
        await r.ping()
        assert proxy.cut() == 1
        with pytest.raises(RedisConnectionError):
            await r.ping()
    async with redis_client(proxy.address) as r:
        assert await r.ping()


async def test_proxy_blackhole_times_out_then_heals(proxy: FaultProxy) -> None:
    """In a black hole a connect + PING and a PING on an open connection both time
    out; healing closes the connection that lost bytes and new ones work."""
    async with redis_client(proxy.address, within=0.4) as before:
        await before.ping()
        proxy.blackhole(True)
        with pytest.raises(RedisTimeoutError):
            await before.ping()
        async with redis_client(proxy.address, within=0.4) as during:
            with pytest.raises(RedisTimeoutError):
                await during.ping()
        assert proxy.stats.dropped_bytes > 0
        proxy.blackhole(False)
    async with redis_client(proxy.address) as after:
        assert await after.ping()


async def test_postgres_restarts_and_recovers(pg_cluster: PostgresCluster) -> None:
    """A fast restart breaks open connections and keeps committed data; a SIGKILL
    of the postmaster and its backends is followed by crash recovery, with the
    data still there."""
    url = await pg_cluster.create_database("chaos")
    con = await asyncpg.connect(url)
    try:
        await con.execute("CREATE TABLE t (v int)")
        await con.execute("INSERT INTO t VALUES (1)")
        await pg_cluster.restart("fast")
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
            await con.fetchval("SELECT 1")
    finally:
        await con.close(timeout=2)
    await pg_cluster.kill()
    assert not pg_cluster.running
    await pg_cluster.start()
    con = await asyncpg.connect(url)
    try:
        assert await con.fetchval("SELECT count(*) FROM t") == 1
    finally:
        await con.close()
    assert "database system was interrupted" in pg_cluster.log_tail(200)


@dataclass
class Stack:
    """Two gateways whose Redis and PostgreSQL are reached through fault proxies."""

    gateways: GatewayCluster
    redis_proxy: FaultProxy
    pg_proxy: FaultProxy
    database_url: str


@pytest.fixture
async def stack(
    redis_server: RedisServer, pg_cluster: PostgresCluster, diagnostics: Diagnostics
) -> AsyncIterator[Stack]:
    """Private Redis and PostgreSQL, a proxy in front of each, two gateways behind them."""
    with (
        FaultProxy(*redis_server.address, name="redis") as redis_proxy,
        FaultProxy(*pg_cluster.address, name="postgres") as pg_proxy,
    ):
        gateways = GatewayCluster(
            2,
            redis_url=redis_server.url(address=redis_proxy.address),
            database_url=pg_cluster.url("flashsale", address=pg_proxy.address),
        )
        diagnostics.append(gateways.logs)
        async with gateways:
            yield Stack(gateways, redis_proxy, pg_proxy, pg_cluster.url("flashsale"))


async def test_gateway_pair_sells_through_proxies(stack: Stack) -> None:
    """60 clients buy a stock of 20 from two gateways: exactly 20 confirmations,
    40 sold out, every invariant holds, both instances answered, both proxies
    carried traffic, and an instance comes back after a SIGKILL + restart."""
    gateways = stack.gateways
    await gateways.put_sku("flash", 20)
    summary = await LoadDriver(gateways.urls, "flash", users=60, seed=1).run()
    report = await check_invariants(
        stack.database_url, "flash", 20, summary, scenario="infra-smoke", faults="none"
    )
    print(report.line())
    assert report.ok, str(report)
    assert summary.counts == {"confirmed": 20, "sold_out": 40}, summary.attempts_by()
    assert set(summary.answers_by_instance()) == {0, 1}
    assert await gateways.report("flash") == {
        "db_stock": 0,
        "redis_stock": 0,
        "pending": 0,
        "sold": 20,
    }
    assert stack.redis_proxy.stats.accepted > 0
    assert stack.pg_proxy.stats.accepted > 0
    await gateways[1].restart()
    assert gateways[1].running
    assert gateways.log_lines("chaos: start #2 of gateway 1")
