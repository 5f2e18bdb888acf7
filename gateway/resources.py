"""The gateway's connections as aiohttp cleanup contexts, each with one ``yield``:
the Redis client, the PostgreSQL pool (migrated, fence sequence created) and the
optional ZooKeeper session; the event sinks once RabbitMQ answers; and
:func:`patiently`, the start-up retry while a dependency is down.
``gateway.app`` puts them in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TypeVar

import asyncpg
import structlog
from aiohttp import web
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.domain.events import EventSink
from gateway.http.appkeys import BOT_CHECK, ORDERS, POOL, REDIS, SETTINGS, ZOOKEEPER
from gateway.lock import create_fence_sequence
from gateway.lock.backoff import pause
from gateway.outbound import OnAnswer, open_sinks
from gateway.outbound.bot_check import SiteVerify
from gateway.postgres.database import create_pool, migrate
from gateway.postgres.orders import Orders
from gateway.redis.connections import create_redis, reach
from gateway.settings import LockFamily, Misconfigured, Settings
from gateway.usecases.ports import NO_BOT_CHECK, BotCheck

# Longest a stopping gateway waits for its PostgreSQL connections to close cleanly.
POOL_CLOSE_S = 2.0
# Pause between two start-up attempts while a dependency is down: 0.1 s, doubling to 2 s.
STARTUP_BACKOFF = ExponentialBackoff(cap=2.0, base=0.1)

T = TypeVar("T")
log = structlog.get_logger(__name__)


async def redis_ctx(app: web.Application) -> AsyncIterator[None]:
    """The Redis client and its bounded pool, once Redis answers."""
    settings = app[SETTINGS]
    redis = create_redis(settings)
    try:
        await patiently("redis", settings.startup_wait_s, lambda: reach(redis, settings))
    except BaseException:
        await redis.aclose()
        raise
    app[REDIS] = redis
    yield
    await redis.aclose()


async def patiently(what: str, wait_s: float, attempt: Callable[[], Awaitable[T]]) -> T:
    """Retry a start-up step while its dependency is down, for up to ``wait_s``.

    A gateway restarted during an outage waits for Redis or PostgreSQL instead
    of exiting at once. What cannot be a server still starting fails at once: a
    :class:`Misconfigured` that is final ("not PostgreSQL", an unknown role, a
    Redis database that does not exist), or any other error.
    """
    deadline = asyncio.get_running_loop().time() + wait_s
    failures = 0
    while True:
        try:
            return await attempt()
        except (OSError, RedisConnectionError, asyncpg.CannotConnectNowError, Misconfigured) as exc:
            if isinstance(exc, Misconfigured) and exc.final:
                raise
            wait = pause(STARTUP_BACKOFF, failures)
            if asyncio.get_running_loop().time() + wait > deadline:
                raise
            if isinstance(exc, Misconfigured):
                found = {"setting": exc.setting, "url": exc.url, "found": exc.found}
            else:
                found = {"cause": repr(exc)}
            log.warning("waiting_for_dependency", dependency=what, **found)
            await asyncio.sleep(wait)
            failures += 1


async def database_ctx(app: web.Application) -> AsyncIterator[None]:
    """The PostgreSQL pool, after the migrations are in place."""
    settings = app[SETTINGS]
    pool = await patiently("postgres", settings.startup_wait_s, lambda: create_pool(settings))
    try:
        async with pool.acquire() as con:
            await migrate(con)
            await create_fence_sequence(con)
    except BaseException:
        await pool.close()
        raise
    app[POOL], app[ORDERS] = pool, Orders(pool)
    yield
    await close_pool(pool)


async def close_pool(pool: asyncpg.Pool) -> None:
    """Close ``pool`` within POOL_CLOSE_S, else cut its connections."""
    try:
        async with asyncio.timeout(POOL_CLOSE_S):
            await pool.close()
    except TimeoutError:
        # A statement stuck on an unreachable server must not hold the exit.
        pool.terminate()


async def zookeeper_ctx(app: web.Application) -> AsyncIterator[None]:
    """The ZooKeeper session of the flush locks, with GATEWAY_FLUSH_LOCK=zookeeper only;
    its timeout is the lock's lease (see gateway/lock/zookeeper.py)."""
    settings = app[SETTINGS]
    session = None
    if settings.flush_lock is LockFamily.ZOOKEEPER:
        try:
            from gateway.lock.zk_session import ZkSession
        except ModuleNotFoundError as exc:
            extra = "pip install 'flashsale-gateway[zookeeper]'"
            raise RuntimeError(f"GATEWAY_FLUSH_LOCK=zookeeper needs kazoo: {extra}") from exc
        session = ZkSession(settings.zookeeper_hosts, session_timeout=settings.lock_lease_s)
        await session.start(wait=max(settings.startup_wait_s, 1.0))
    app[ZOOKEEPER] = session
    yield
    if session is not None:
        await session.stop()


async def bot_check_ctx(app: web.Application) -> AsyncIterator[None]:
    """The waiting rooms' bot check, with GATEWAY_BOT_CHECK_URL: one connection
    pool to the provider, closed on stop; else the check nobody passes."""
    settings = app[SETTINGS]
    check: BotCheck = NO_BOT_CHECK if settings.bot_check_url is None else SiteVerify(settings)
    app[BOT_CHECK] = check
    yield
    await check.close()


@asynccontextmanager
async def sinks_when_ready(
    settings: Settings, on_answer: OnAnswer
) -> AsyncIterator[list[EventSink]]:
    """:func:`gateway.outbound.open_sinks`, waiting up to GATEWAY_STARTUP_WAIT_S
    for a RabbitMQ that does not answer yet, as start-up waits for Redis."""
    async with AsyncExitStack() as stack:
        yield await patiently(
            "rabbitmq",
            settings.startup_wait_s,
            lambda: stack.enter_async_context(open_sinks(settings, on_answer)),
        )
