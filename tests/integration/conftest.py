"""Fixtures shared by the integration tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from gateway.lock import LockSubscriber
from tests.integration.lock_support import Backend, close_pg_pool, open_pg_pool
from tests.support.redis_cluster import LocalRedisCluster


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


@pytest.fixture(params=["redis", "postgres", "cluster"])
def backend_kind(request: pytest.FixtureRequest) -> tuple[str, LocalRedisCluster | None]:
    """Which lock backend, and the session's cluster when that is the one (started
    here, outside the test's event loop, and only when a cluster test runs)."""
    cluster = request.getfixturevalue("redis_cluster") if request.param == "cluster" else None
    return request.param, cluster


@pytest.fixture
async def backend(
    backend_kind: tuple[str, LocalRedisCluster | None],
    redis: Redis,
    key_prefix: str,
    database_url: str,
) -> AsyncIterator[Backend]:
    """The lock backend under test, on a lock name of this test's own: the shared
    Redis, PostgreSQL, or the session's Redis Cluster."""
    kind, cluster = backend_kind
    pool = await open_pg_pool(database_url) if kind == "postgres" else None
    client: Redis | RedisCluster = redis if cluster is None else cluster.client()
    subscriber = LockSubscriber(client)
    yield Backend(kind, client, pool, f"{key_prefix}:{{lock}}:lock", subscriber)
    await subscriber.aclose()
    if pool is not None:
        await close_pg_pool(pool)
    if isinstance(client, RedisCluster):
        await client.aclose()
