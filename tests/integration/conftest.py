"""Fixtures shared by the integration tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from gateway.lock import LockSubscriber
from gateway.lock.zk_session import ZkSession
from gateway.postgres.database import migrate
from gateway.redis.layout import lock_key
from testkit.rabbitmq_servers import RabbitServer
from testkit.redis_cluster import LocalRedisCluster
from testkit.services import create_database, drop_database
from testkit.zookeeper_servers import ZooKeeperServer
from tests.integration.lock_support import Backend, close_pg_pool, open_pg_pool

# The ZooKeeper session of the in-process locks: long enough for any lease a test
# asks for (the lock's default lease is the session timeout).
ZK_SESSION_TIMEOUT_S = 10.0

# The servers a lock family needs started for the session, if any.
Servers = LocalRedisCluster | ZooKeeperServer | None


@pytest.fixture
async def con(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the session database, migrated (for tests of SQL itself)."""
    connection = await asyncpg.connect(database_url)
    await migrate(connection)
    yield connection
    await connection.close()


@pytest.fixture
async def events_db() -> AsyncIterator[str]:
    """A migrated database of this test's own: no other test's events in its
    outbox, and no other test's relay delivering them."""
    name = f"flashsale_events_{uuid.uuid4().hex[:8]}"
    url = await create_database(name)
    connection = await asyncpg.connect(url)
    await migrate(connection)
    await connection.close()
    yield url
    await drop_database(name)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """A private Redis Cluster (3 primaries, 3 replicas), started once per session on
    first use and stopped at its end. Tests share it under their own key prefixes; a
    test that kills a node starts it again (it rejoins as a replica)."""
    cluster = LocalRedisCluster()
    try:
        asyncio.run(cluster.start())
        yield cluster
    finally:
        asyncio.run(cluster.close())


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """A private standalone ZooKeeper (Debian's package, installed when missing),
    started once per session on first use and stopped at its end. Tests share it
    under lock names of their own."""
    server = ZooKeeperServer()
    try:
        asyncio.run(server.start())
        yield server
    finally:
        asyncio.run(server.close())


@pytest.fixture(scope="session")
def rabbit_server() -> Iterator[RabbitServer]:
    """A private RabbitMQ node, started once per session on first use, for the
    tests that stop the broker: the shared one on 5672 is never restarted."""
    server = RabbitServer()
    try:
        asyncio.run(server.start())
        yield server
    finally:
        asyncio.run(server.close())


@pytest.fixture(params=["redis", "postgres", "cluster", "zookeeper"])
def backend_kind(request: pytest.FixtureRequest) -> tuple[str, Servers]:
    """Which lock backend, and the session's cluster or ZooKeeper when that is the one
    (started here, outside the test's event loop, and only when such a test runs)."""
    fixture = {"cluster": "redis_cluster", "zookeeper": "zookeeper_server"}.get(request.param)
    return request.param, None if fixture is None else request.getfixturevalue(fixture)


@pytest.fixture
def name(key_prefix: str) -> str:
    """This test's lock name: the layout's lock key of a sku called "lock"."""
    return lock_key(key_prefix, "lock")


@pytest.fixture
async def backend(
    backend_kind: tuple[str, Servers],
    redis: Redis,
    name: str,
    database_url: str,
) -> AsyncIterator[Backend]:
    """The lock backend under test, on a lock name of this test's own: the shared
    Redis, PostgreSQL, or the session's Redis Cluster."""
    kind, servers = backend_kind
    pool = await open_pg_pool(database_url) if kind == "postgres" else None
    cluster = servers if isinstance(servers, LocalRedisCluster) else None
    client: Redis | RedisCluster = redis if cluster is None else cluster.client()
    subscriber = LockSubscriber(client)
    zookeeper = None
    if isinstance(servers, ZooKeeperServer):
        zookeeper = ZkSession(servers.hosts, session_timeout=ZK_SESSION_TIMEOUT_S)
        await zookeeper.start(wait=10)
    yield Backend(kind, client, pool, name, subscriber, zookeeper)
    if zookeeper is not None:
        await zookeeper.stop()
    await subscriber.aclose()
    if pool is not None:
        await close_pg_pool(pool)
    if isinstance(client, RedisCluster):
        await client.aclose()
