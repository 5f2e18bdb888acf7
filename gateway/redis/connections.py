"""Redis connections: one client for a single Redis, Sentinels or a Redis Cluster.

``create_redis`` is the only place a gateway Redis client is made. The three
deployments give one interface (``RedisClient``) to the adapters: every key of a
sku carries the ``{sku}`` hash tag, so a script, a pipeline or a MULTI over one
sku's keys lands on one cluster node, and redis-py's ``RedisCluster`` routes it
there (following MOVED and refreshing its slot map after a failover).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeAlias

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.exceptions import RedisError

from gateway.domain.errors import RedisUnavailable
from gateway.lock import connection_errors
from gateway.settings import Settings

RedisClient: TypeAlias = Redis | RedisCluster


class _SentinelBlockingPool(SentinelConnectionPool, BlockingConnectionPool):
    """Connections to the primary the Sentinels name, from a pool that blocks when empty."""


_CONNECTION: dict[str, Any] = {
    "socket_connect_timeout": 2,
    "socket_timeout": 5,
    "decode_responses": True,
}


def create_redis(settings: Settings) -> RedisClient:
    """A client on the Redis ``settings`` name.

    With ``GATEWAY_REDIS_CLUSTER_NODES`` a ``RedisCluster`` seeded by those
    nodes, with at most ``GATEWAY_REDIS_POOL_SIZE`` connections per node (its
    pool refuses rather than blocks when they are all busy; auto-pipelining keeps
    the number in use small). With ``GATEWAY_REDIS_SENTINELS`` the client follows
    the primary the Sentinels name, so a failover moves it to the promoted
    replica. Otherwise ``GATEWAY_REDIS_URL``. The last two pools block (up to 5 s)
    rather than fail when exhausted.
    """
    if settings.redis_cluster_nodes:
        seeds = [ClusterNode(host, port) for host, port in settings.redis_cluster_nodes]
        return RedisCluster(
            startup_nodes=seeds, max_connections=settings.redis_pool_size, **_CONNECTION
        )
    if list(settings.redis_sentinels):
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(settings.redis_sentinels), socket_connect_timeout=2, socket_timeout=2
        )
        client: Redis = sentinel.master_for(
            settings.redis_sentinel_master,
            connection_pool_class=_SentinelBlockingPool,
            max_connections=settings.redis_pool_size,
            timeout=5,
            **_CONNECTION,
        )
        return client
    pool = BlockingConnectionPool.from_url(
        settings.redis_url, max_connections=settings.redis_pool_size, timeout=5, **_CONNECTION
    )
    return Redis.from_pool(pool)  # the client owns the pool: aclose() disconnects it


async def redis_call(call: Awaitable[Any]) -> Any:
    """Await a Redis call; a driver error becomes :class:`RedisUnavailable` (a 503),
    the one translation every Redis adapter makes, and so does a connection
    closed under a write that the client lets escape untyped
    (:func:`gateway.lock.connection_errors`). (``Any``: redis-py types its
    replies as bytes or str, while these clients decode every reply to str.)"""
    try:
        with connection_errors():
            return await call
    except RedisError as exc:
        raise RedisUnavailable(f"redis: {type(exc).__name__}") from exc
