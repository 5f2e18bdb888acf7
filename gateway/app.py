"""The application factory: resources as cleanup contexts, routes, middleware.

``create_app(settings)`` builds an application whose resources start in order
(Redis, PostgreSQL with migrations, the purchase service with its scripts and
change feed) and stop in reverse. On shutdown the service drains first: new
purchases get 503 and ``/readyz`` turns 503 at once, queued batches finish.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from gateway import views
from gateway.admin import StockAdmin
from gateway.catalog import Catalog
from gateway.database import create_pool, migrate
from gateway.events import ChangeFeed
from gateway.inventory import Inventory, create_redis
from gateway.keys import ADMIN, METRICS, ORDERS, REDIS, SERVICE, SETTINGS
from gateway.metrics import Metrics
from gateway.middlewares import errors, measure
from gateway.orders import Orders
from gateway.payloads import MAX_BODY
from gateway.service import PurchaseService
from gateway.settings import Settings
from gateway.soldout import SoldOut


async def redis_ctx(app: web.Application) -> AsyncIterator[None]:
    """The Redis client and its bounded pool."""
    redis = create_redis(app[SETTINGS])
    app[REDIS] = redis
    yield
    await redis.aclose()


async def database_ctx(app: web.Application) -> AsyncIterator[None]:
    """The PostgreSQL pool, after the migrations are in place."""
    pool = await create_pool(app[SETTINGS])
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
    await inventory.load_scripts()
    catalog, soldout = Catalog(orders), SoldOut()
    service = PurchaseService(
        inventory=inventory,
        orders=orders,
        catalog=catalog,
        soldout=soldout,
        lock_for=flush_locks(settings, redis, orders.pool),
        lock_wait_s=settings.lock_lease_s,
        batch_max=settings.batch_max,
        batch_wait_s=settings.batch_wait_ms / 1000,
        queue_max=settings.queue_max,
        observer=metrics,
    )
    metrics.watch_queue(lambda: service.batcher.depth)
    feed = ChangeFeed(redis, settings.channel, soldout, catalog)
    feed_task = asyncio.create_task(feed.run(), name="change-feed")
    app[SERVICE] = service
    app[ADMIN] = StockAdmin(service)
    yield
    await service.close()
    feed_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await feed_task


async def start_draining(app: web.Application) -> None:
    """First step of shutdown: refuse new purchases, report not ready."""
    if SERVICE in app:
        app[SERVICE].draining = True


def flush_locks(settings: Settings, redis: object, pool: object) -> None:
    """Placeholder until gateway.lock lands."""
    return None


def create_app(settings: Settings) -> web.Application:
    """Build the gateway application for ``settings``."""
    metrics = Metrics()
    middlewares = [measure(metrics), errors] if settings.metrics else [errors]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY)
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app.cleanup_ctx.extend([redis_ctx, database_ctx, service_ctx])
    app.on_shutdown.append(start_draining)
    app.add_routes(views.routes(with_metrics=settings.metrics))
    return app
