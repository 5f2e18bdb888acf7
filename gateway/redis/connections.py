"""Redis connections: one client for a single Redis, Sentinels or a Redis Cluster.

``create_redis`` is the only place a gateway Redis client is made. The three
deployments give one interface (``RedisClient``) to the adapters: every key of a
sku carries the ``{sku}`` hash tag, so a script, a pipeline or a MULTI over one
sku's keys lands on one cluster node, and redis-py's ``RedisCluster`` routes it
there (following MOVED and refreshing its slot map after a failover, at most
every :data:`RELEARN_S`: :class:`PacedCluster`).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable
from typing import Any, TypeAlias
from urllib.parse import urlsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    BusyLoadingError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from gateway.domain.errors import RedisUnavailable
from gateway.lock import connection_errors
from gateway.settings import Misconfigured, Settings

RedisClient: TypeAlias = Redis | RedisCluster


# How often a cluster client may learn the cluster's topology again. redis-py
# 8.1.0 learns it (CLUSTER SLOTS of a node, then COMMAND) before each retry of
# each command that met a connection error, with no pause: while a primary is
# down, every command for its slots. tests/integration/test_cluster_soak.py's
# gateway learned it 225 times in its three failovers, which took it 7.6 s of
# CPU over the test (4.1 s paced), enough that a loaded CI run saw its timers
# run 0.25 s late.
RELEARN_S = 0.1


class PacedCluster(RedisCluster):
    """A ``RedisCluster`` that learns the topology again at most every :data:`RELEARN_S`.

    The commands that find the slot map stale meanwhile wait for the one
    learning it, then use what it learned; one that finds it stale again
    within :data:`RELEARN_S` of the last learning waits out the rest. Reads
    redis-py's own flag of a stale map (``_initialize``): the release is
    pinned, and ``tests/integration/test_redis_cluster_pacing.py`` fails when
    the flag changes meaning.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pace = asyncio.Lock()
        self._learned_at = -RELEARN_S

    async def initialize(
        self,
        additional_startup_nodes_info: list[tuple[str, int]] | None = None,
        last_failed_node_name: str | None = None,
    ) -> RedisCluster:
        if not self._initialize:
            return self
        async with self._pace:
            if self._initialize:
                wait = self._learned_at + RELEARN_S - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                try:
                    await super().initialize(additional_startup_nodes_info, last_failed_node_name)
                finally:
                    self._learned_at = time.monotonic()
        return self


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
        return PacedCluster(
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


# How long the probe behind a failed connection waits for each step.
PROBE_TIMEOUT_S = 1.0
DEFAULT_PORT = 6379


async def reach(redis: RedisClient, settings: Settings) -> None:
    """Ping Redis through ``redis``, made by :func:`create_redis` from ``settings``.

    Raises :class:`Misconfigured` naming the Redis setting and what is there:
    not final (``final=False``) when nothing answers yet or Redis is loading
    its data, as a server still starting shows.
    """
    try:
        await redis.ping()
    except (RedisError, RedisClusterException) as exc:
        raise await _diagnosis(redis, settings, exc) from exc


def _setting(settings: Settings) -> tuple[str, str]:
    """The setting that names the Redis, and its value."""
    for field in ("redis_cluster_nodes", "redis_sentinels"):
        addresses = getattr(settings, field)
        if addresses:
            return field, ",".join(f"{host}:{port}" for host, port in addresses)
    return "redis_url", settings.redis_url


async def _diagnosis(redis: RedisClient, settings: Settings, exc: BaseException) -> Misconfigured:
    """What a failed ping found: Redis's own refusal when it answered, else what
    a probe of the URL's address finds."""
    field, url = _setting(settings)
    refusal = _refusal(redis, exc)
    if refusal is not None:
        text, final = refusal
        return Misconfigured(field, url, text, final=final)
    if isinstance(exc, MasterNotFoundError):  # its words list every connection's settings
        master = f"GATEWAY_REDIS_SENTINEL_MASTER={settings.redis_sentinel_master}"
        return Misconfigured(field, url, f"no Sentinel names a primary for {master}", final=False)
    parts = urlsplit(url)
    if field != "redis_url":  # several addresses: the driver's words say which failed
        return Misconfigured(field, url, _one_line(exc), final=False)
    if isinstance(exc.__context__, socket.gaierror):
        found = f"host {parts.hostname} not found ({exc.__context__.strerror})"
        return Misconfigured(field, url, found, final=False)
    port = parts.port or DEFAULT_PORT
    where = parts.path if parts.scheme == "unix" else f"{parts.hostname}:{port}"
    answer = await _probe(parts.scheme, parts.hostname or "", port, parts.path)
    if parts.scheme == "rediss":
        # A plain Redis reads a TLS handshake as a command that never ends and
        # says nothing, so the driver only ever saw a timeout; a plain PING
        # answered in Redis's own words says why.
        if answer is not None and answer[:1] in (b"+", b"-"):
            found = f"TLS refused: {where} is a Redis without TLS (use redis://, or TLS there)"
            return Misconfigured(field, url, found)
        return Misconfigured(field, url, _one_line(exc), final=False)
    if answer is None:
        return Misconfigured(field, url, f"nothing answers at {where}", final=False)
    if answer[:1] not in (b"+", b"-"):
        return Misconfigured(field, url, f"not Redis (no answer to PING at {where})")
    found = f"Redis did not let us in ({_one_line(exc)})"
    return Misconfigured(field, url, found, final=False)


def _refusal(redis: RedisClient, exc: BaseException) -> tuple[str, bool] | None:
    """What Redis said when it answered the ping with an error, and whether that
    is final; None when it did not answer."""
    if isinstance(exc, AuthenticationError | AuthenticationWrongNumberOfArgsError):
        return f"authentication failed ({_one_line(exc)})", True
    if isinstance(exc, BusyLoadingError):
        return "Redis is loading its data", False
    if isinstance(exc, ResponseError) and "DB index is out of range" in str(exc):
        db = redis.connection_pool.connection_kwargs.get("db") if isinstance(redis, Redis) else 0
        return f"database {db} does not exist", True
    if isinstance(exc, ResponseError):
        return f"Redis refused ({_one_line(exc)})", True
    return None


async def _probe(scheme: str, host: str, port: int, path: str) -> bytes | None:
    """What the address answers to an inline PING (empty: nothing in time), or
    None when no connection opens. Redis answers +PONG, or -NOAUTH when it
    wants a password; anything else is not Redis."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            if scheme == "unix":
                reader, writer = await asyncio.open_unix_connection(path)
            else:
                reader, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(b"PING\r\n")
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            return await reader.readline()
    except (OSError, TimeoutError, ValueError):
        return b""
    finally:
        writer.transport.abort()


def _one_line(exc: BaseException) -> str:
    """The driver's message on one line (its class when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__
