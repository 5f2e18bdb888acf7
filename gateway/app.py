"""The application factory: resources as cleanup contexts, routes, middleware.

``create_app(settings)`` builds an application whose resources start in order
(Redis, PostgreSQL with migrations, the purchase service with its scripts and
change feed) and stop in reverse. On shutdown the service drains first: new
purchases get 503 and ``/readyz`` turns 503 at once, queued batches finish.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import asyncpg
import structlog
from aiohttp import web
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway import views
from gateway.admin import StockAdmin
from gateway.catalog import Catalog
from gateway.database import Pool, create_pool, migrate
from gateway.events import ChangeFeed
from gateway.inventory import Inventory, create_redis
from gateway.keys import ADMIN, METRICS, ORDERS, RECONCILER, REDIS, SERVICE, SETTINGS
from gateway.lock import LockSubscriber, PgAdvisoryLock, RedisLock, load_lock_scripts
from gateway.metrics import Metrics
from gateway.middlewares import errors, measure
from gateway.orders import Orders
from gateway.payloads import MAX_BODY
from gateway.reconciler import Reconciler
from gateway.service import FlushLock, PurchaseService
from gateway.settings import Settings
from gateway.soldout import SoldOut

QUEUE_SAMPLE_S = 0.5

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
    except BaseException:
        await pool.close()
        raise
    app[ORDERS] = Orders(pool)
    yield
    await pool.close()


async def service_ctx(app: web.Application) -> AsyncIterator[None]:
    """The purchase service: scripts loaded, change feed subscribed; drained on stop."""
    settings, metrics = app[SETTINGS], app[METRICS]
    redis, orders = app[REDIS], app[ORDERS]
    inventory = Inventory(redis, settings, on_noscript=metrics.noscript_reload)
    await _patiently("redis", settings.startup_wait_s, inventory.load_scripts)
    await load_lock_scripts(redis)
    subscriber = LockSubscriber(redis, client_name=f"{settings.key_prefix}-lock-sub")
    catalog, soldout = Catalog(orders), SoldOut()
    service = PurchaseService(
        inventory=inventory,
        orders=orders,
        catalog=catalog,
        soldout=soldout,
        lock_for=flush_locks(settings, redis, orders.pool, subscriber, metrics),
        lock_wait_s=settings.lock_lease_s,
        batch_max=settings.batch_max,
        batch_wait_s=settings.batch_wait_ms / 1000,
        queue_max=settings.queue_max,
        observer=metrics,
    )
    reconciler = Reconciler(
        service,
        timeout_s=settings.reservation_timeout_s,
        interval_s=settings.reconcile_interval_s,
        publish=metrics.sku_state,
    )
    feed = ChangeFeed(redis, settings.channel, soldout, catalog)
    tasks = [
        asyncio.create_task(feed.run(), name="change-feed"),
        asyncio.create_task(reconciler.run(), name="reconciler"),
        asyncio.create_task(_sample_queue(service, metrics), name="queue-sampler"),
    ]
    app[SERVICE] = service
    app[ADMIN] = StockAdmin(service)
    app[RECONCILER] = reconciler
    yield
    await service.close()
    await subscriber.aclose()
    for task in tasks:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*tasks)


async def _sample_queue(service: PurchaseService, metrics: Metrics) -> None:
    while True:
        metrics.sample_queue(service.batcher.depth)
        await asyncio.sleep(QUEUE_SAMPLE_S)


async def start_draining(app: web.Application) -> None:
    """First step of shutdown: refuse new purchases, report not ready."""
    if SERVICE in app:
        app[SERVICE].draining = True


def flush_locks(
    settings: Settings, redis: Redis, pool: Pool, subscriber: LockSubscriber, metrics: Metrics
) -> Callable[[str], FlushLock] | None:
    """One flush lock object per sku (``GATEWAY_FLUSH_LOCK``), or None for no lock."""
    if settings.flush_lock == "none":
        return None
    locks: dict[str, FlushLock] = {}

    def lock_for(sku: str) -> FlushLock:
        lock = locks.get(sku)
        if lock is None:
            name = f"{settings.key_prefix}:{{{sku}}}:lock"
            if settings.flush_lock == "redis":
                lock = RedisLock(
                    redis,
                    name,
                    lease=settings.lock_lease_s,
                    metrics=metrics,
                    subscriber=subscriber,
                )
            else:
                lock = PgAdvisoryLock(pool, name, lease=settings.lock_lease_s, metrics=metrics)
            locks[sku] = lock
        return lock

    return lock_for


def create_app(settings: Settings) -> web.Application:
    """Build the gateway application for ``settings``."""
    metrics = Metrics(settings.multiproc_dir)
    middlewares = [measure(metrics), errors] if settings.metrics else [errors]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY)
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app.cleanup_ctx.extend([redis_ctx, database_ctx, service_ctx])
    app.on_shutdown.append(start_draining)
    app.add_routes(views.routes(with_metrics=settings.metrics))
    return app
