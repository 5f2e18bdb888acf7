"""The application factory: resources as cleanup contexts, routes, middleware.

``create_app(settings)`` builds an application whose resources start in order
(Redis, PostgreSQL with migrations, then the use cases with their scripts,
locks and change feed) and stop in reverse; the connections' contexts live in
:mod:`gateway.resources`. Here, and only here, each use case is handed the
adapters it works with: :func:`build_gateway` builds the object graph from the
settings and the opened resources without starting anything (a lone queue
writer's by :func:`build_flushing`), and the cleanup contexts load the scripts,
start the background tasks and stop them; the order events' relay has a
context of its own (:func:`events_ctx`), last. A stop begins with the lame duck
(``/readyz`` 503, purchases still served, see :func:`lame_duck`); then the
batcher drains: new purchases get 503, the backlog's batches finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from gateway.domain.events import EventSink, SinkName
from gateway.domain.model import Strategy

# Opened is imported from here by tests and benches: re-exported.
from gateway.flushing import Flushing, build_flushing, event_stream
from gateway.flushing import Opened as Opened
from gateway.http import admin_views, payment_views, views
from gateway.http.admin_tokens import AdminTokens
from gateway.http.appkeys import (
    ADMIN,
    ADMIN_TOKENS,
    ADMISSIONS,
    ANSWER,
    ANSWERS,
    BATCHER,
    BOT_CHECK,
    CATALOG,
    LANES,
    LIFECYCLE,
    METRICS,
    ORDERS,
    POOL,
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
from gateway.lock import load_lock_scripts
from gateway.ops.answer_log import AnswerLog
from gateway.ops.loop_lag import LoopLag
from gateway.ops.metrics import BacklogMetrics, Metrics
from gateway.postgres.database import Pool, create_pool
from gateway.postgres.identity import DatabaseIdentity
from gateway.postgres.inventory import Inventory
from gateway.postgres.lifecycle import Lifecycle
from gateway.postgres.limit_groups import LimitGroups
from gateway.postgres.lookups import Arbitrations, OrderLookups, PriorLookups
from gateway.postgres.outbox import Outbox
from gateway.postgres.retention import Retention
from gateway.postgres.sale_gate import PostgresSaleGate
from gateway.redis.change_feed import ChangeFeed
from gateway.redis.confirmed_scan import ConfirmedScan
from gateway.redis.identity import IdentityStamp
from gateway.redis.layout import channel
from gateway.redis.rebuild_lease import RebuildLease
from gateway.redis.rooms import Rooms
from gateway.resources import (
    bot_check_ctx,
    close_pool,
    database_ctx,
    patiently,
    redis_ctx,
    sinks_when_ready,
    zookeeper_ctx,
)
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
from gateway.usecases.deductions import Deductions
from gateway.usecases.lifecycle import HeldUnits, OrderLifecycle, PaymentWindow
from gateway.usecases.marking import SoldOutMarking
from gateway.usecases.ports import NO_BOT_CHECK, NO_SIGNER, Batching, Lookups, Marking, Signing
from gateway.usecases.purchases import Purchases
from gateway.usecases.rebuilds import Rebuilds
from gateway.usecases.reconciler import Reconciler
from gateway.usecases.relay import Relay
from gateway.usecases.sale_gate import SaleGate
from gateway.usecases.servable import Servability
from gateway.usecases.sold_out import SoldOut
from gateway.usecases.tracking import OrderTracker
from gateway.write.batcher import Batcher
from gateway.write.lanes import HostLanes
from gateway.write.writer import QueueWriter

if TYPE_CHECKING:
    from gateway.lock.zk_session import ZkSession

BACKLOG_SAMPLE_S = 0.5
# The relay's connections besides one per outbound sink: the stream's and the upkeep's.
RELAY_CONNECTIONS = 2
# Longest a stopping gateway waits for its last flushes' first events to be
# handed off (a pass and a record take about 0.3 s; what is left goes to a relay).
HANDOFF_FINISH_S = 1.0
# Longest a stopping gateway waits for its background loops to end once cancelled.
TASK_STOP_S = 2.0

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Gateway:
    """A gateway's object graph, built and not started (:func:`build_gateway`)."""

    flushing: Flushing
    batcher: Batcher
    lanes: HostLanes | None
    lease: RebuildLease
    rebuilds: Rebuilds
    rooms: Rooms
    catalog: Catalog
    purchases: Purchases
    admissions: Admissions
    servability: Servability
    admin: StockAdmin
    reconciler: Reconciler
    tracker: OrderTracker
    lifecycle: OrderLifecycle
    feed: ChangeFeed
    lag: LoopLag
    writer: QueueWriter | None


def build_gateway(opened: Opened) -> Gateway:
    """Every use case of a gateway, handed its adapters; nothing started, no I/O."""
    settings, metrics, orders = opened.settings, opened.metrics, opened.orders
    flushing = build_flushing(opened)
    reservations, locks = flushing.reservations, flushing.locks
    inventory = Inventory(opened.pool)
    tags = flushing.tags
    lifecycle = Lifecycle(opened.pool, settings.strategy)
    catalog, soldout = Catalog(inventory, settings.strategy, tags), SoldOut()
    batcher = _batcher(settings, flushing)
    lanes = _lanes(settings, metrics, batcher)
    lease = RebuildLease(opened.redis, settings, on_noscript=metrics.scripts.reloaded, tags=tags)
    rebuilds = Rebuilds(lease, orders, metrics.rebuilds, share=settings.rebuild_share)
    scan = ConfirmedScan(opened.redis, settings.key_prefix, tags)
    marking = SoldOutMarking(soldout, lease, scan, metrics.purchases)
    batching: Batching = batcher if lanes is None else lanes
    lookups = Lookups(OrderLookups(orders), PriorLookups(orders), Arbitrations(orders))
    window = PaymentWindow(HeldUnits(lifecycle), lookups.orders)
    purchases = _purchases(
        opened, flushing, catalog, soldout, marking, rebuilds, batching, lookups, window
    )
    rooms = Rooms(opened.redis, settings, on_noscript=metrics.scripts.reloaded, tags=tags)
    servability = Servability(settings, inventory)
    reconciler = _reconciler(opened, flushing, inventory, catalog, rebuilds)
    subscribers = (soldout, catalog, reconciler, flushing.group_tags)
    feed = ChangeFeed(opened.redis, channel(settings.key_prefix), subscribers=subscribers)
    return Gateway(
        flushing=flushing,
        batcher=batcher,
        lanes=lanes,
        lease=lease,
        rebuilds=rebuilds,
        rooms=rooms,
        catalog=catalog,
        purchases=purchases,
        admissions=_admissions(opened, catalog, soldout, purchases, window, rooms),
        servability=servability,
        admin=StockAdmin(
            reservations=reservations,
            orders=orders,
            inventory=inventory,
            locks=locks,
            catalog=catalog,
            soldout=soldout,
            servability=servability,
            rebuilds=rebuilds,
            groups=LimitGroups(opened.pool),
        ),
        reconciler=reconciler,
        tracker=OrderTracker(orders=orders, streams=flushing.streams),
        lifecycle=OrderLifecycle(
            transitions=lifecycle,
            sweeps=lifecycle,
            listings=lifecycle,
            returns=reservations,
            rooms=rooms,
            catalog=catalog,
            metrics=metrics.lifecycle,
            sweep_s=settings.expiry_sweep_s,
        ),
        feed=feed,
        lag=LoopLag(metrics.loop.lagged, stall_report_s=settings.loop_stall_report_s),
        # Any sku may be put on the queue strategy: the writer serves those
        # whose stream exists, found once a second.
        writer=_writer(opened, flushing, inventory) if settings.queue_writer else None,
    )


def _batcher(settings: Settings, flushing: Flushing) -> Batcher:
    """The batcher in front of the flusher."""
    return Batcher(
        flushing.flusher.flush,
        batch_max=settings.batch_max,
        batch_wait_s=settings.batch_wait_ms / 1000,
        backlog_max=settings.backlog_max,
        on_empty=flushing.flusher.emptied,
        on_the_way=flushing.reservations.on_the_way,
    )


def _lanes(settings: Settings, metrics: Metrics, batcher: Batcher) -> HostLanes | None:
    """The host's lanes in front of ``batcher``, with several workers only."""
    if settings.lanes_dir is None or settings.lane_count <= 1:
        return None
    return HostLanes(
        batcher,
        directory=settings.lanes_dir,
        index=settings.lane_index,
        count=settings.lane_count,
        backlog_max=settings.backlog_max,
        observer=metrics.lanes,
    )


def _purchases(
    opened: Opened,
    flushing: Flushing,
    catalog: Catalog,
    soldout: SoldOut,
    marking: Marking,
    rebuilds: Rebuilds,
    batching: Batching,
    lookups: Lookups,
    window: PaymentWindow,
) -> Purchases:
    """The purchase use case, with its look-ups and the strategies without Redis state."""
    settings, metrics, orders = opened.settings, opened.metrics, opened.orders
    reservations = flushing.reservations
    deductions = Deductions(
        deduction_strategies(settings, metrics, opened.pool),
        gate=SaleGate(PostgresSaleGate(opened.pool), settings),
        draining=batching,
        limit=settings.backlog_max,
        observer=metrics.purchases,
    )
    return Purchases(
        catalog=catalog,
        soldout=soldout,
        marking=marking,
        reservations=reservations,
        stocks=orders,
        lookups=lookups,
        batcher=batching,
        flusher=flushing.flusher,
        rebuilds=rebuilds,
        streams=flushing.streams,
        deductions=deductions,
        doubt=flushing.doubt,
        window=window,
        observer=metrics.purchases,
    )


def _admissions(
    opened: Opened,
    catalog: Catalog,
    soldout: SoldOut,
    purchases: Purchases,
    window: PaymentWindow,
    rooms: Rooms,
) -> Admissions:
    """The waiting rooms in front of ``purchases``, signing tokens when a secret is set."""
    settings = opened.settings
    signer: Signing = NO_SIGNER
    if settings.admission_secret is not None:
        signer = Signer(settings.admission_secret, settings.admission_secret_previous)
    return Admissions(
        catalog=catalog,
        soldout=soldout,
        purchases=purchases,
        window=window,
        rooms=rooms,
        signer=signer,
        bot_check=opened.bot_check,
        observer=opened.metrics.rooms,
    )


def _reconciler(
    opened: Opened, flushing: Flushing, inventory: Inventory, catalog: Catalog, rebuilds: Rebuilds
) -> Reconciler:
    """The reconciler of the reservations ``flushing`` makes and settles."""
    settings = opened.settings
    return Reconciler(
        reservations=flushing.reservations,
        orders=opened.orders,
        inventory=inventory,
        stamp=IdentityStamp(opened.redis, settings.key_prefix),
        database=DatabaseIdentity(opened.pool),
        retention=Retention(opened.pool, settings.release_retention_s, settings.events_retention_s),
        locks=flushing.locks,
        timeout_s=settings.reservation_timeout_s,
        interval_s=settings.reconcile_interval_s,
        observer=opened.metrics.reconciler,
        queued=flushing.streams.queued_ids,
        catalog=catalog,
        rebuilds=rebuilds,
    )


def deduction_strategies(
    settings: Settings, metrics: Metrics, pool: Pool[Any]
) -> dict[Strategy, Deduction]:
    """The strategies that decide in PostgreSQL alone (``Strategy.reserves``
    false), by name (gateway.strategies)."""
    rows = Rows(pool)
    return {
        Strategy.SQL_DIRECT: SqlDirect(rows),
        Strategy.OPTIMISTIC: Optimistic(rows, settings, metrics.optimistic),
        Strategy.PESSIMISTIC: Pessimistic(rows),
    }


def _writer(opened: Opened, flushing: Flushing, inventory: Inventory) -> QueueWriter:
    """A queue writer; it looks for a dead writer's entries twice per claim idle time."""
    return QueueWriter(
        streams=flushing.streams,
        flusher=flushing.flusher,
        inventory=inventory,
        claim_every_s=opened.settings.writer_claim_idle_s / 2,
        observer=opened.metrics.streams,
    )


def _opened(app: web.Application, zookeeper: ZkSession | None = None) -> Opened:
    resources = (app[SETTINGS], app[METRICS], app[REDIS], app[POOL], app[ORDERS], zookeeper)
    # A lone queue writer has no waiting rooms, and no bot check.
    return Opened(*resources, app.get(BOT_CHECK, NO_BOT_CHECK))


async def _load_scripts(opened: Opened, flushing: Flushing) -> None:
    """Load the reservation and lock scripts, waiting for Redis at start-up, and
    the skus' limit groups (a lone writer hears no change feed: those of its start)."""
    await patiently("redis", opened.settings.startup_wait_s, flushing.reservations.load_scripts)
    await load_lock_scripts(opened.redis)
    await flushing.group_tags.load()


async def service_ctx(app: web.Application) -> AsyncIterator[None]:
    """The use cases: scripts loaded, change feed subscribed; drained on stop."""
    opened = _opened(app, app[ZOOKEEPER])
    gateway = build_gateway(opened)
    flushing = gateway.flushing
    opened.metrics.lock.set_lease(opened.settings.lock_lease_s)
    await _load_scripts(opened, flushing)
    await gateway.lease.load_scripts()
    await gateway.reconciler.adopt_database()
    if gateway.lanes is not None:
        await gateway.lanes.start()
    await gateway.rooms.load_scripts()
    await gateway.servability.report()
    _publish(app, gateway)
    tasks = _background(gateway, app[ANSWERS], opened.metrics.backlog)
    yield
    await gateway.batcher.close()
    if gateway.lanes is not None:
        await gateway.lanes.close()
    await gateway.rebuilds.close()
    await flushing.lock_subscriber.aclose()
    if flushing.handoff is not None:
        await flushing.handoff.finish(HANDOFF_FINISH_S)
    await _stop(tasks)
    await flushing.group_tags.close()


def _publish(app: web.Application, gateway: Gateway) -> None:
    """Hand the use cases to the views."""
    app[RESERVATIONS] = gateway.flushing.reservations
    app[BATCHER], app[LANES] = gateway.batcher, gateway.lanes
    app[PURCHASES], app[ADMISSIONS] = gateway.purchases, gateway.admissions
    app[CATALOG] = gateway.catalog
    app[SERVABILITY], app[ADMIN] = gateway.servability, gateway.admin
    app[RECONCILER], app[TRACKER] = gateway.reconciler, gateway.tracker
    app[LIFECYCLE] = gateway.lifecycle


def _background(
    gateway: Gateway, answers: AnswerLog, backlog: BacklogMetrics
) -> list[asyncio.Task[None]]:
    """Start the gateway's background loops."""
    tasks = [
        asyncio.create_task(gateway.lag.run(), name="loop-lag"),
        asyncio.create_task(gateway.feed.run(), name="change-feed"),
        asyncio.create_task(gateway.reconciler.run(), name="reconciler"),
        asyncio.create_task(gateway.lifecycle.run(), name="expiry-sweep"),
        asyncio.create_task(_sample_backlog(gateway.batcher, backlog), name="backlog-sampler"),
        asyncio.create_task(answers.run(), name="answer-summary"),
        *_handing_off(gateway.flushing),
    ]
    if gateway.writer is not None:
        tasks.append(asyncio.create_task(gateway.writer.run(), name="queue-writer"))
    return tasks


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel the background loops and wait for them, boundedly: one that died is
    reported, not raised, and one that does not stop is left behind with a log
    line, so the rest of shutdown (pools, connections) still runs."""
    if not tasks:
        # Nothing started (the relay off): asyncio.wait refuses an empty set.
        return
    for task in tasks:
        task.cancel()
    done, stuck = await asyncio.wait(tasks, timeout=TASK_STOP_S)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.error("background_task_failed", task=task.get_name(), cause=repr(task.exception()))
    for task in stuck:
        log.error("background_task_stuck", task=task.get_name())


def build_relay(opened: Opened, outbound: Sequence[EventSink], pool: Pool[Any]) -> Relay:
    """The order events' relay to the stream and the ``outbound`` sinks (the
    webhook, RabbitMQ: ``gateway.outbound.open_sinks``) on ``pool``; nothing
    started. With a webhook, the stream is never trimmed past an event still
    owed to it."""
    settings = opened.settings
    outbox = Outbox(pool)
    # The webhook's backlog bounds the stream's trim.
    webhook = any(sink.name is SinkName.WEBHOOK for sink in outbound)
    stream = event_stream(opened.settings, opened.redis, outbox if webhook else None)
    return Relay(
        outbox=outbox,
        sinks=[stream, *outbound],
        observer=opened.metrics.events,
        batch=settings.events_batch,
        poll_s=settings.events_poll_s,
    )


async def events_ctx(app: web.Application) -> AsyncIterator[None]:
    """The order events' relay, with GATEWAY_EVENTS_RELAY: the configured sinks
    opened (waiting for a RabbitMQ still starting) and registered in the
    outbox (owed every event from then on), the relay's loops run until the
    stop, then the sinks closed. The relay has a pool of its own, a
    connection per sink and one for its upkeep: a claim holds its connection
    while its batch is out, and a slow receiver must not take the flushes'."""
    opened, tasks = _opened(app), []
    async with contextlib.AsyncExitStack() as stack:
        if opened.settings.events_relay:
            answered = opened.metrics.events.webhook_answer
            outbound = await stack.enter_async_context(sinks_when_ready(opened.settings, answered))
            size = len(outbound) + RELAY_CONNECTIONS
            pool = await create_pool(dataclasses.replace(opened.settings, db_pool_size=size))
            stack.push_async_callback(close_pool, pool)
            relay = build_relay(opened, outbound, pool)
            await relay.register()
            tasks.append(asyncio.create_task(relay.run(), name="relay"))
        yield
        await _stop(tasks)


async def writer_ctx(app: web.Application) -> AsyncIterator[None]:
    """A stream writer on its own (``flashsale-gateway writer``): no HTTP, no batcher."""
    opened = _opened(app)
    flushing = build_flushing(opened)
    writer = _writer(opened, flushing, Inventory(opened.pool))
    await _load_scripts(opened, flushing)
    tasks = [asyncio.create_task(writer.run(), name="queue-writer"), *_handing_off(flushing)]
    yield
    if flushing.handoff is not None:
        await flushing.handoff.finish(HANDOFF_FINISH_S)
    await _stop(tasks)
    await flushing.lock_subscriber.aclose()


def _handing_off(flushing: Flushing) -> list[asyncio.Task[None]]:
    """The hand-off's loop, when the flushes hand their first events off."""
    if flushing.handoff is None:
        return []
    return [asyncio.create_task(flushing.handoff.run(), name="events-handoff")]


def create_writer_app(settings: Settings) -> web.Application:
    """An application that only runs a queue writer (started without a listener)."""
    app = web.Application()
    app[SETTINGS] = settings
    app[METRICS] = Metrics(settings.multiproc_dir)
    app.cleanup_ctx.extend([redis_ctx, database_ctx, writer_ctx])
    return app


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
    then the backlog is flushed and settled."""
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
    middleware = gateway_middleware(
        answer, {**views.QUERIES, **admin_views.QUERIES, **payment_views.QUERIES}
    )
    app = web.Application(middlewares=[middleware], client_max_size=MAX_BODY)
    app[ANSWER] = answer
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app[STOPPING] = asyncio.Event()
    app[PROXIES] = proxies
    app[ANSWERS] = answers
    app[ADMIN_TOKENS] = AdminTokens(settings.admin_token, settings.admin_token_file)
    app[WAITING_PAGE] = WaitingPage.build(
        settings.waiting_page_return_origins, settings.waiting_page_image_origins
    )
    app.cleanup_ctx.extend(
        [redis_ctx, database_ctx, zookeeper_ctx, bot_check_ctx, service_ctx, events_ctx]
    )
    app.on_shutdown.append(drain)
    app.add_routes(views.routes(with_metrics=settings.metrics))
    app.add_routes(admin_views.routes())
    app.add_routes(payment_views.routes())
    return app
