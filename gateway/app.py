"""The application factory: resources as cleanup contexts, routes, middleware.

``create_app(settings)`` builds an application whose resources start in order
(Redis, PostgreSQL with migrations, then the use cases with their scripts,
locks and change feed) and stop in reverse; the connections' contexts live in
:mod:`gateway.resources`. Here, and only here, each use case is handed the
adapters it works with. A stop begins with the lame duck
(``/readyz`` 503, purchases still served, see :func:`lame_duck`); then the
batcher drains: new purchases get 503, queued batches finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from gateway.domain.model import Strategy
from gateway.http import admin_views, views
from gateway.http.admin_tokens import AdminTokens
from gateway.http.appkeys import (
    ADMIN,
    ADMIN_TOKENS,
    ADMISSIONS,
    ANSWER,
    ANSWERS,
    BATCHER,
    LANES,
    METRICS,
    ORDERS,
    PROXIES,
    PURCHASES,
    RECONCILER,
    REDIS,
    RESERVATIONS,
    SERVABILITY,
    SETTINGS,
    STOPPING,
    TRACKER,
    WAITING_PAGE,
    ZOOKEEPER,
)
from gateway.http.clients import TrustedProxies
from gateway.http.middlewares import answering, gateway_middleware
from gateway.http.payloads import MAX_BODY
from gateway.http.waiting_page import WaitingPage
from gateway.lock import LockSubscriber, load_lock_scripts
from gateway.ops.answer_log import AnswerLog
from gateway.ops.loop_lag import LoopLag
from gateway.ops.metrics import BacklogMetrics, Metrics
from gateway.postgres.orders import Orders
from gateway.redis.change_feed import ChangeFeed
from gateway.redis.layout import channel
from gateway.redis.reservations import Reservations
from gateway.redis.rooms import Rooms
from gateway.redis.streams import Streams
from gateway.resources import database_ctx, patiently, redis_ctx, zookeeper_ctx
from gateway.settings import Settings
from gateway.strategies import Deduction
from gateway.strategies.optimistic import Optimistic
from gateway.strategies.pessimistic import Pessimistic
from gateway.strategies.rows import Rows
from gateway.strategies.sql_direct import SqlDirect
from gateway.usecases.admin import StockAdmin
from gateway.usecases.admission import Admissions
from gateway.usecases.admission_tokens import Signer
from gateway.usecases.catalog import Catalog
from gateway.usecases.doubt import RedisDoubt, window_for
from gateway.usecases.purchases import Purchases
from gateway.usecases.rebuilds import Rebuilds
from gateway.usecases.reconciler import Reconciler
from gateway.usecases.sale_gate import SaleGate
from gateway.usecases.servable import Servability
from gateway.usecases.sold_out import SoldOut
from gateway.usecases.tracking import OrderTracker
from gateway.write.batcher import Batcher
from gateway.write.flusher import Flusher
from gateway.write.lanes import HostLanes
from gateway.write.sku_locks import sku_locks
from gateway.write.writer import QueueWriter

BACKLOG_SAMPLE_S = 0.5
# Longest a stopping gateway waits for its background loops to end once cancelled.
TASK_STOP_S = 2.0

log = structlog.get_logger(__name__)


async def service_ctx(app: web.Application) -> AsyncIterator[None]:
    """The use cases: scripts loaded, change feed subscribed; drained on stop."""
    settings, metrics = app[SETTINGS], app[METRICS]
    redis, orders = app[REDIS], app[ORDERS]
    reservations = Reservations(redis, settings, on_noscript=metrics.scripts.reloaded)
    await patiently("redis", settings.startup_wait_s, reservations.load_scripts)
    await load_lock_scripts(redis)
    if await reservations.adopt(await orders.identity()):
        log.warning("redis_state_dropped", reason="another database")
    lock_subscriber = LockSubscriber(redis, client_name=f"{settings.key_prefix}-lock-sub")
    locks = sku_locks(settings, redis, orders.pool, lock_subscriber, metrics.lock, app[ZOOKEEPER])
    metrics.lock.set_lease(settings.lock_lease_s)
    deductions = synchronous_strategies(app)
    catalog, soldout = Catalog(orders, settings.strategy), SoldOut()
    doubt = RedisDoubt(window_for(settings.reconcile_interval_s))
    flusher = Flusher(
        reservations=reservations,
        orders=orders,
        locks=locks,
        observer=metrics.flushes,
        on_redis_failure=doubt.failed,
    )
    batcher = Batcher(
        flusher.flush,
        batch_max=settings.batch_max,
        batch_wait_s=settings.batch_wait_ms / 1000,
        backlog_max=settings.backlog_max,
        on_idle=flusher.idle,
        on_the_way=reservations.on_the_way,
    )
    app[RESERVATIONS], app[BATCHER] = reservations, batcher
    lanes: HostLanes | None = None
    if settings.lanes_dir is not None and settings.lane_count > 1:
        lanes = HostLanes(
            batcher,
            directory=settings.lanes_dir,
            index=settings.lane_index,
            count=settings.lane_count,
            backlog_max=settings.backlog_max,
            observer=metrics.lanes,
        )
        await lanes.start()
    app[LANES] = lanes
    rebuilds = Rebuilds(reservations, orders, metrics.rebuilds, share=settings.rebuild_share)
    streams = Streams(redis, settings)
    app[TRACKER] = OrderTracker(orders=orders, streams=streams)
    app[PURCHASES] = Purchases(
        catalog=catalog,
        soldout=soldout,
        reservations=reservations,
        orders=orders,
        batcher=batcher if lanes is None else lanes,
        flusher=flusher,
        rebuilds=rebuilds,
        observer=metrics.purchases,
        streams=streams,
        deductions=deductions,
        deductions_max=settings.backlog_max,
        gate=SaleGate(orders, settings),
        doubt=doubt,
    )
    rooms = Rooms(redis, settings, on_noscript=metrics.scripts.reloaded)
    await rooms.load_scripts()
    signer = None
    if settings.admission_secret is not None:
        signer = Signer(settings.admission_secret, settings.admission_secret_previous)
    app[ADMISSIONS] = Admissions(
        catalog=catalog,
        soldout=soldout,
        purchases=app[PURCHASES],
        rooms=rooms,
        signer=signer,
        observer=metrics.rooms,
    )
    app[SERVABILITY] = servability = Servability(settings, orders)
    await servability.report()
    app[ADMIN] = StockAdmin(
        reservations=reservations,
        orders=orders,
        locks=locks,
        catalog=catalog,
        soldout=soldout,
        servability=servability,
        rebuilds=rebuilds,
    )
    app[RECONCILER] = reconciler = Reconciler(
        reservations=reservations,
        orders=orders,
        locks=locks,
        timeout_s=settings.reservation_timeout_s,
        interval_s=settings.reconcile_interval_s,
        publish=metrics.reconciler.sku_state,
        queued=streams.queued_ids,
        catalog=catalog,
        rebuilds=rebuilds,
    )
    feed = ChangeFeed(redis, channel(settings.key_prefix), subscribers=(soldout, catalog))
    lag = LoopLag(metrics.loop.lagged, stall_report_s=settings.loop_stall_report_s)
    tasks = [
        asyncio.create_task(lag.run(), name="loop-lag"),
        asyncio.create_task(feed.run(), name="change-feed"),
        asyncio.create_task(reconciler.run(), name="reconciler"),
        asyncio.create_task(_sample_backlog(batcher, metrics.backlog), name="backlog-sampler"),
        asyncio.create_task(app[ANSWERS].run(), name="answer-summary"),
    ]
    # Any sku may be put on the queue strategy: the writer serves those whose
    # stream exists, found once a second.
    if settings.queue_writer:
        writer = _writer(settings, streams, flusher, orders, metrics)
        tasks.append(asyncio.create_task(writer.run(), name="queue-writer"))
    yield
    await batcher.close()
    if lanes is not None:
        await lanes.close()
    await rebuilds.close()
    await lock_subscriber.aclose()
    await _stop(tasks)


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel the background loops and wait for them, boundedly: one that died is
    reported, not raised, and one that does not stop is left behind with a log
    line, so the rest of shutdown (pools, connections) still runs."""
    for task in tasks:
        task.cancel()
    done, stuck = await asyncio.wait(tasks, timeout=TASK_STOP_S)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.error("background_task_failed", task=task.get_name(), cause=repr(task.exception()))
    for task in stuck:
        log.error("background_task_stuck", task=task.get_name())


def _writer(
    settings: Settings, streams: Streams, flusher: Flusher, orders: Orders, metrics: Metrics
) -> QueueWriter:
    """A queue writer; it looks for a dead writer's entries twice per claim idle time."""
    return QueueWriter(
        streams=streams,
        flusher=flusher,
        orders=orders,
        claim_every_s=settings.writer_claim_idle_s / 2,
        observer=metrics.streams,
    )


async def writer_ctx(app: web.Application) -> AsyncIterator[None]:
    """A stream writer on its own (``flashsale-gateway writer``): no HTTP, no batcher."""
    settings, metrics = app[SETTINGS], app[METRICS]
    redis, orders = app[REDIS], app[ORDERS]
    reservations = Reservations(redis, settings, on_noscript=metrics.scripts.reloaded)
    await patiently("redis", settings.startup_wait_s, reservations.load_scripts)
    await load_lock_scripts(redis)
    lock_subscriber = LockSubscriber(redis, client_name=f"{settings.key_prefix}-lock-sub")
    locks = sku_locks(settings, redis, orders.pool, lock_subscriber, metrics.lock)
    flusher = Flusher(
        reservations=reservations, orders=orders, locks=locks, observer=metrics.flushes
    )
    writer = _writer(settings, Streams(redis, settings), flusher, orders, metrics)
    task = asyncio.create_task(writer.run(), name="queue-writer")
    yield
    await _stop([task])
    await lock_subscriber.aclose()


def create_writer_app(settings: Settings) -> web.Application:
    """An application that only runs a queue writer (started without a listener)."""
    app = web.Application()
    app[SETTINGS] = settings
    app[METRICS] = Metrics(settings.multiproc_dir)
    app.cleanup_ctx.extend([redis_ctx, database_ctx, writer_ctx])
    return app


def synchronous_strategies(app: web.Application) -> dict[Strategy, Deduction]:
    """The strategies that decide in PostgreSQL alone, by name (gateway.strategies)."""
    rows = Rows(app[ORDERS].pool)
    return {
        Strategy.SQL_DIRECT: SqlDirect(rows),
        Strategy.OPTIMISTIC: Optimistic(rows, app[SETTINGS], app[METRICS].optimistic),
        Strategy.PESSIMISTIC: Pessimistic(rows),
    }


async def _sample_backlog(batcher: Batcher, backlog: BacklogMetrics) -> None:
    while True:
        backlog.sample(batcher.backlog)
        await asyncio.sleep(BACKLOG_SAMPLE_S)


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
        log.info("draining", queued=batcher.backlog)
    await batcher.close()


def create_app(settings: Settings) -> web.Application:
    """Build the gateway application for ``settings``."""
    metrics = Metrics(settings.multiproc_dir)
    proxies = TrustedProxies(settings.trusted_proxies)
    answers = AnswerLog(metrics.stats)
    answer = answering(proxies, metrics, answers, timed=settings.metrics)
    middleware = gateway_middleware(answer, views.QUERIES)
    app = web.Application(middlewares=[middleware], client_max_size=MAX_BODY)
    app[ANSWER] = answer
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app[STOPPING] = asyncio.Event()
    app[PROXIES] = proxies
    app[ANSWERS] = answers
    app[ADMIN_TOKENS] = AdminTokens(settings.admin_token, settings.admin_token_file)
    app[WAITING_PAGE] = WaitingPage.build(settings.waiting_page_return_origins)
    app.cleanup_ctx.extend([redis_ctx, database_ctx, zookeeper_ctx, service_ctx])
    app.on_shutdown.append(drain)
    app.add_routes(views.routes(with_metrics=settings.metrics))
    app.add_routes(admin_views.routes())
    return app
