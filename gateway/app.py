"""The application factory: resources as cleanup contexts, routes, middleware.

``create_app(settings)`` builds an application whose resources start in order
(Redis, PostgreSQL with migrations, then the use cases with their scripts,
locks and change feed) and stop in reverse. Here, and only here, each use case
is handed the adapters it works with. A stop begins with the lame duck
(``/readyz`` 503, purchases still served, see :func:`lame_duck`); then the
batcher drains: new purchases get 503, queued batches finish.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import asyncpg
import structlog
from aiohttp import web
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway import views
from gateway.admin import StockAdmin
from gateway.appkeys import (
    ADMIN,
    ANSWERS,
    BATCHER,
    INVENTORY,
    METRICS,
    ORDERS,
    PROXIES,
    PURCHASES,
    RECONCILER,
    REDIS,
    SETTINGS,
    STOPPING,
)
from gateway.batcher import Batcher
from gateway.catalog import Catalog
from gateway.clients import TrustedProxies, parse_networks
from gateway.connections import create_redis
from gateway.database import create_pool, migrate
from gateway.events import ChangeFeed
from gateway.flusher import Flusher
from gateway.inventory import Inventory
from gateway.layout import channel
from gateway.lock import LockSubscriber, create_fence_sequence, load_lock_scripts
from gateway.metrics import Metrics
from gateway.middlewares import gateway_middleware
from gateway.orders import Orders
from gateway.overload import AnswerLog
from gateway.payloads import MAX_BODY
from gateway.purchases import Purchases
from gateway.reconciler import Reconciler
from gateway.settings import Settings
from gateway.skulocks import sku_locks
from gateway.soldout import SoldOut

QUEUE_SAMPLE_S = 0.5
# Longest a stopping gateway waits for its PostgreSQL connections to close cleanly.
POOL_CLOSE_S = 2.0

T = TypeVar("T")
log = structlog.get_logger(__name__)


async def redis_ctx(app: web.Application) -> AsyncIterator[None]:
    """The Redis client and its bounded pool."""
    redis = create_redis(app[SETTINGS])
    app[REDIS] = redis
    yield
    await redis.aclose()


async def _patiently(what: str, wait_s: float, attempt: Callable[[], Awaitable[T]]) -> T:
    """Retry a start-up step while its dependency is down, for up to ``wait_s``.

    A gateway restarted during an outage waits for Redis or PostgreSQL instead
    of exiting at once; a step that fails for another reason fails at once.
    """
    deadline = asyncio.get_running_loop().time() + wait_s
    pause = 0.1
    while True:
        try:
            return await attempt()
        except (OSError, RedisConnectionError, asyncpg.CannotConnectNowError) as exc:
            if asyncio.get_running_loop().time() + pause > deadline:
                raise
            log.warning("waiting_for_dependency", dependency=what, cause=repr(exc))
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)


async def database_ctx(app: web.Application) -> AsyncIterator[None]:
    """The PostgreSQL pool, after the migrations are in place."""
    settings = app[SETTINGS]
    pool = await _patiently("postgres", settings.startup_wait_s, lambda: create_pool(settings))
    try:
        async with pool.acquire() as con:
            await migrate(con)
            await create_fence_sequence(con)
    except BaseException:
        await pool.close()
        raise
    app[ORDERS] = Orders(pool)
    yield
    try:
        async with asyncio.timeout(POOL_CLOSE_S):
            await pool.close()
    except TimeoutError:
        # A statement stuck on an unreachable server must not hold the exit.
        pool.terminate()


async def service_ctx(app: web.Application) -> AsyncIterator[None]:
    """The use cases: scripts loaded, change feed subscribed; drained on stop."""
    settings, metrics = app[SETTINGS], app[METRICS]
    redis, orders = app[REDIS], app[ORDERS]
    inventory = Inventory(redis, settings, on_noscript=metrics.noscript_reload)
    await _patiently("redis", settings.startup_wait_s, inventory.load_scripts)
    await load_lock_scripts(redis)
    if await inventory.adopt(await orders.identity()):
        log.warning("redis_state_dropped", reason="another database")
    subscriber = LockSubscriber(redis, client_name=f"{settings.key_prefix}-lock-sub")
    locks = sku_locks(settings, redis, orders.pool, subscriber, metrics)
    catalog, soldout = Catalog(orders), SoldOut()
    flusher = Flusher(inventory=inventory, orders=orders, locks=locks, observer=metrics)
    batcher = Batcher(
        flusher.flush,
        batch_max=settings.batch_max,
        batch_wait_s=settings.batch_wait_ms / 1000,
        queue_max=settings.queue_max,
        on_idle=flusher.idle,
    )
    app[INVENTORY], app[BATCHER] = inventory, batcher
    app[PURCHASES] = Purchases(
        catalog=catalog,
        soldout=soldout,
        inventory=inventory,
        orders=orders,
        batcher=batcher,
        flusher=flusher,
        observer=metrics,
    )
    app[ADMIN] = StockAdmin(
        inventory=inventory, orders=orders, locks=locks, catalog=catalog, soldout=soldout
    )
    app[RECONCILER] = reconciler = Reconciler(
        inventory=inventory,
        orders=orders,
        locks=locks,
        timeout_s=settings.reservation_timeout_s,
        interval_s=settings.reconcile_interval_s,
        publish=metrics.sku_state,
    )
    feed = ChangeFeed(redis, channel(settings.key_prefix), soldout, catalog)
    tasks = [
        asyncio.create_task(feed.run(), name="change-feed"),
        asyncio.create_task(reconciler.run(), name="reconciler"),
        asyncio.create_task(_sample_queue(batcher, metrics), name="queue-sampler"),
        asyncio.create_task(app[ANSWERS].run(), name="answer-summary"),
    ]
    yield
    await batcher.close()
    await subscriber.aclose()
    for task in tasks:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*tasks)


async def _sample_queue(batcher: Batcher, metrics: Metrics) -> None:
    while True:
        metrics.sample_queue(batcher.depth)
        await asyncio.sleep(QUEUE_SAMPLE_S)


async def lame_duck(app: web.Application, seconds: float) -> None:
    """The first step of a stop: ``/readyz`` answers 503 at once while purchases
    are still served for ``seconds``, so the load balancer's health checks take
    this instance out of rotation before it turns anything away."""
    app[STOPPING].set()
    if seconds > 0:
        log.info("lame_duck", seconds=seconds)
        await asyncio.sleep(seconds)


async def drain(app: web.Application) -> None:
    """The step of shutdown after the lame duck: new purchases get 503 at once,
    then every queued batch is flushed and settled."""
    if BATCHER not in app:
        return
    batcher = app[BATCHER]
    if not batcher.closing:
        log.info("draining", queued=batcher.depth)
    await batcher.close()


def create_app(settings: Settings) -> web.Application:
    """Build the gateway application for ``settings``."""
    metrics = Metrics(settings.multiproc_dir)
    proxies = TrustedProxies(parse_networks(settings.trusted_proxies))
    answers = AnswerLog(metrics.stats)
    middleware = gateway_middleware(proxies, metrics, answers, timed=settings.metrics)
    app = web.Application(middlewares=[middleware], client_max_size=MAX_BODY)
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app[STOPPING] = asyncio.Event()
    app[PROXIES] = proxies
    app[ANSWERS] = answers
    app.cleanup_ctx.extend([redis_ctx, database_ctx, service_ctx])
    app.on_shutdown.append(drain)
    app.add_routes(views.routes(with_metrics=settings.metrics))
    return app
