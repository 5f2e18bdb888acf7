"""Prometheus metrics: one registry per application, one small observer per component.

The three health signals of a flash sale are lock wait time, locks lost before
release, and the deduction failure rate (purchase outcomes and flush failures
by reason). Each component reports through an observer protocol of its own
(``gateway.write.flusher.FlushObserver``, ``gateway.lock.LockMetrics``, ...),
and each protocol is fulfilled here by a small object that owns its metric
families; :class:`Metrics` holds them, the registry and the request counts.
Each application gets its own registry, so several apps can share a process
(tests do). Label children used on the hot path are bound once, up front.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.ops.event_metrics import EventMetrics
from gateway.ops.lifecycle_metrics import LifecycleMetrics
from gateway.ops.request_stats import PURCHASE_ROUTE, RequestCollector, RequestStats
from gateway.ops.sku_series import SkuSeries

if TYPE_CHECKING:
    from gateway.domain.skus import SkuState

OUTCOMES = (
    "confirmed",
    "sold_out",
    "duplicate",
    "in_progress",
    "invalid",
    "unavailable",
    "accepted",
    "not_started",
    "ended",
    "rate_limited",
    # The buyer closed, reset or stalled before its body arrived: no fault of
    # the gateway's, and kept out of "unavailable" (which pages).
    "client_gone",
)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REQUEST_DURATION = "flashsale_request_duration_seconds"


class Metrics:
    """Every metric of one gateway: the registry, the request counts, and one
    observer per component, each handed to its component by ``gateway.app``."""

    def __init__(self, multiproc_dir: str | None = None) -> None:
        # With several workers every value lives in files under multiproc_dir
        # (prometheus-client's multiprocess mode) and a scrape adds them up.
        self._multiproc_dir = multiproc_dir
        self.registry = r = CollectorRegistry(auto_describe=True)
        # Purchases by outcome and request latency are plain integers in one
        # process, summed at scrape time (gateway.ops.request_stats); with several
        # workers they go to the shared files as well, so any worker's scrape
        # sums them all at once.
        self.stats = RequestStats(OUTCOMES, LATENCY_BUCKETS)
        self.request: Callable[[str, str, float], None] = self.stats.record
        if multiproc_dir is None:
            r.register(
                RequestCollector(
                    self.stats, purchases="flashsale_purchases", duration=REQUEST_DURATION
                )
            )
        else:
            self.request = _SharedRequests(self.stats, r).record
        self.loop = LoopMetrics(r)
        self.lock = FlushLockMetrics(r)
        self.flushes = FlushMetrics(r, self.lock)
        self.backlog = BacklogMetrics(r)
        self.lanes = LaneMetrics(r)
        self.skus = SkuSeries(r, removable=multiproc_dir is None)
        self.reconciler = ReconcileMetrics(r, self.skus)
        self.purchases = PurchaseMetrics(r, self.stats, self.skus)
        self.rebuilds = RebuildMetrics(r)
        self.scripts = ScriptMetrics(r)
        self.rooms = RoomMetrics(r, self.skus)
        self.connections = ConnectionMetrics(r)
        self.streams = StreamMetrics(r, self.skus)
        self.optimistic = OptimisticMetrics(r)
        self.lifecycle = LifecycleMetrics(r)
        self.events = EventMetrics(r)

    def render(self) -> bytes:
        """The exposition text of every metric (of every worker, with several)."""
        if self._multiproc_dir is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=self._multiproc_dir)  # type: ignore[no-untyped-call]
        return generate_latest(merged)


class LoopMetrics:
    """The event loop's lag (gateway.ops.loop_lag.LoopLag's ``observe``)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.loop_lag = Histogram(
            "flashsale_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 100 ms (gateway.ops.loop_lag).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.loop_own_lag = Histogram(
            "flashsale_event_loop_own_lag_seconds",
            "That lag less the time the loop's thread waited for a CPU or was stolen"
            " by the hypervisor: what this process caused (a blocking call, a long"
            " computation), not the machine.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def lagged(self, seconds: float, own: float) -> None:
        """The loop ran its lag timer ``seconds`` late, ``own`` of them while its
        thread could have run."""
        self.loop_lag.observe(seconds)
        self.loop_own_lag.observe(own)


class FlushLockMetrics:
    """The flush lock's wait, acquisitions, timeouts, renewals, losses, fencing,
    and the hold time and lease the lease rule compares (gateway.write.lease_rule);
    the lock's observer (``gateway.lock.LockMetrics``)."""

    def __init__(self, r: CollectorRegistry) -> None:
        # Lock holds: fine where flushes are, coarse up to the largest sensible lease.
        hold_buckets = (*LATENCY_BUCKETS, 10.0, 30.0, 60.0)
        self.lock_wait = Histogram(
            "flashsale_lock_wait_seconds",
            "Wait to acquire a flush lock.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.lock_acquisitions = Counter(
            "flashsale_lock_acquisitions",
            "Lock acquisitions, by whether they had to wait.",
            ["contended"],
            registry=r,
        )
        self.lock_timeouts = Counter(
            "flashsale_lock_timeouts", "Lock acquisitions that gave up waiting.", registry=r
        )
        self.lock_renewals = Counter(
            "flashsale_lock_renewals", "Lease renewals by the watchdog.", registry=r
        )
        self.lock_renewal_failures = Counter(
            "flashsale_lock_renewal_failures", "Renewal attempts that failed.", registry=r
        )
        self.locks_lost = Counter(
            "flashsale_locks_lost", "Locks whose lease ran out while held.", registry=r
        )
        self.fenced = Counter(
            "flashsale_fenced_out", "Flushes rejected for a stale fencing token.", registry=r
        )
        # The lease rule (gateway.write.lease_rule): p99 hold against lease / 3.
        self.lock_hold = Histogram(
            "flashsale_lock_hold_seconds",
            "Time a flush lock was held, acquisition to release.",
            buckets=hold_buckets,
            registry=r,
        )
        self.lock_lease = Gauge(
            "flashsale_lock_lease_seconds",
            "The flush lock's lease (GATEWAY_LOCK_LEASE_S).",
            registry=r,
            multiprocess_mode="max",
        )

    def set_lease(self, seconds: float) -> None:
        """The lease the flush locks are taken with."""
        self.lock_lease.set(seconds)

    def acquired(self, wait_s: float, *, contended: bool) -> None:
        """A first acquisition after ``wait_s`` seconds."""
        self.lock_wait.observe(wait_s)
        self.lock_acquisitions.labels("true" if contended else "false").inc()

    def released(self, held_s: float) -> None:
        """A normal release after ``held_s`` seconds held."""
        self.lock_hold.observe(held_s)

    def timed_out(self) -> None:
        """An acquisition gave up."""
        self.lock_timeouts.inc()

    def renewed(self) -> None:
        """The watchdog renewed a lease."""
        self.lock_renewals.inc()

    def renewal_failed(self) -> None:
        """One renewal attempt failed."""
        self.lock_renewal_failures.inc()

    def lost(self) -> None:
        """A lock was lost while held."""
        self.locks_lost.inc()

    def fenced_out(self) -> None:
        """A flush was fenced out."""
        self.fenced.inc()


class FlushMetrics:
    """Batches flushed and failed (gateway.write.flusher.FlushObserver); a flush
    fenced out counts where the lock's fencing does."""

    def __init__(self, r: CollectorRegistry, lock: FlushLockMetrics) -> None:
        self._lock = lock
        self.flush_failures = Counter(
            "flashsale_flush_failures", "Flushes that failed, by reason.", ["reason"], registry=r
        )
        self.batch_size = Histogram(
            "flashsale_batch_size", "Purchases per flush.", buckets=BATCH_BUCKETS, registry=r
        )
        self.flush_duration = Histogram(
            "flashsale_flush_duration_seconds",
            "Time to commit and settle one batch.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def flushed(self, size: int, seconds: float) -> None:
        """A batch committed and settled."""
        self.batch_size.observe(size)
        self.flush_duration.observe(seconds)

    def flush_failed(self, reason: str) -> None:
        """A batch failed and was given back."""
        self.flush_failures.labels(reason).inc()

    def fenced_out(self) -> None:
        """A flush was fenced out."""
        self._lock.fenced_out()


class BacklogMetrics:
    """The batcher's backlog, sampled (not set on the hot path)."""

    def __init__(self, r: CollectorRegistry) -> None:
        # The name is public (dashboards, alerts): it predates "backlog".
        self.backlog_depth = Gauge(
            "flashsale_queue_depth",
            "Purchases in the batcher's backlog: waiting for or in a flush.",
            registry=r,
            multiprocess_mode="livesum",
        )

    def sample(self, depth: int) -> None:
        """The backlog now."""
        self.backlog_depth.set(depth)


class LaneMetrics:
    """The host's lanes (gateway.write.lanes): purchases flushed for another
    worker, and those a worker kept because the owner could not take them."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.lane_passed = Counter(
            "flashsale_lane_passed",
            "Purchases another worker of this host reserved and this one flushed.",
            registry=r,
        )
        # Every worker's links, summed: W * (W - 1) once a host of W workers is
        # linked (fewer while one starts, or after one was lost).
        self.lane_links = Gauge(
            "flashsale_lane_links",
            "Open links from this host's workers to the owners of other skus.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.lane_kept = Counter(
            "flashsale_lane_kept",
            "Purchases flushed where they were reserved, their sku's owner"
            " unreachable or draining.",
            ["reason"],
            registry=r,
        )

    def linked(self, change: int) -> None:
        """A link to another worker opened (+1) or closed (-1)."""
        self.lane_links.inc(change)

    def passed(self, count: int) -> None:
        """``count`` purchases passed on to this worker joined its backlog."""
        self.lane_passed.inc(count)

    def kept(self, reason: str) -> None:
        """A purchase is flushed here: its owner is ``unreachable`` or ``draining``."""
        self.lane_kept.labels(reason).inc()


class ReconcileMetrics:
    """What the reconciler found per sku (gateway.usecases.reconciler.ReconcileObserver)."""

    def __init__(self, r: CollectorRegistry, skus: SkuSeries) -> None:
        self._skus = skus
        self.pending = Gauge(
            "flashsale_reservations_pending",
            "Units reserved in Redis, not yet settled.",
            ["sku"],
            registry=r,
        )
        self.drift = Gauge(
            "flashsale_stock_drift",
            "Database stock minus Redis stock and pending units.",
            ["sku"],
            registry=r,
        )
        skus.labelled(self.pending, self.drift)

    def sku_state(self, sku: str, pending: int, drift: int) -> None:
        """A sku's pending units and drift, as one pass found them."""
        self.pending.labels(sku).set(pending)
        self.drift.labels(sku).set(drift)
        self._skus.seen(sku)

    def sale(self, state: SkuState) -> None:
        """An active sku's stock on sale, units held and units sold."""
        self._skus.sale(state)

    def retain(self, skus: Collection[str]) -> None:
        """Only ``skus`` are active: every other sku's series go."""
        self._skus.retain(skus)


class PurchaseMetrics:
    """Reloads, sheds and sold-out filters of the purchases
    (gateway.usecases.purchases.PurchaseObserver)."""

    def __init__(self, r: CollectorRegistry, stats: RequestStats, skus: SkuSeries) -> None:
        self._stats = stats
        self.purchase_confirmed = skus.purchase_confirmed
        self.reloads = Counter(
            "flashsale_stock_reloads", "Stock keys reloaded from the database.", registry=r
        )
        self.shed = Counter(
            "flashsale_shed", "Purchases refused with 503 because the backlog was full.", registry=r
        )
        self.confirmed_id_builds = Counter(
            "flashsale_confirmed_id_builds",
            "Passes over a sold-out sku's confirmed orders to build its replay filter.",
            registry=r,
        )
        self.confirmed_ids_read = Counter(
            "flashsale_confirmed_ids_read",
            "Confirmed request ids read by those passes.",
            registry=r,
        )
        self.confirmed_id_build_seconds = Counter(
            "flashsale_confirmed_id_build_seconds",
            "Time those passes took, in the background (HSCAN round trips and hashing).",
            registry=r,
        )

    def stock_reloaded(self) -> None:
        """A missing stock key was loaded from the database."""
        self.reloads.inc()

    def shed_one(self) -> None:
        """A purchase was refused because the backlog was full."""
        self.shed.inc()
        self._stats.shed += 1

    def confirmed_ids_built(self, count: int, seconds: float) -> None:
        """A sold-out sku's replay filter was built over ``count`` confirmed orders."""
        self.confirmed_id_builds.inc()
        self.confirmed_ids_read.inc(count)
        self.confirmed_id_build_seconds.inc(seconds)


class RebuildMetrics:
    """Lost sales rebuilt (gateway.usecases.rebuilds.RebuildObserver)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.rebuilds = Counter("flashsale_sale_rebuilds", "Lost sales rebuilt here.", registry=r)
        self.rebuild_seconds = Counter(
            "flashsale_sale_rebuild_seconds", "Time those rebuilds took (paced).", registry=r
        )

    def rebuilt(self, orders: int, seconds: float) -> None:
        """A sku's buyers and done hashes were rebuilt from ``orders`` order rows."""
        self.rebuilds.inc()
        self.rebuild_seconds.inc(seconds)


class ScriptMetrics:
    """Lua scripts Redis had forgotten (the Redis adapters' ``on_noscript``)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.noscript = Counter(
            "flashsale_noscript_reloads", "Scripts reloaded after NOSCRIPT.", ["script"], registry=r
        )

    def reloaded(self, script: str) -> None:
        """Redis had forgotten ``script``: it was loaded again."""
        self.noscript.labels(script).inc()


class RoomMetrics:
    """Waiting rooms and admission tokens (gateway.usecases.admission.AdmissionObserver)."""

    def __init__(self, r: CollectorRegistry, skus: SkuSeries) -> None:
        self._skus = skus
        self.room_length = Gauge(
            "flashsale_waiting_room_length",
            "People waiting in a sku's waiting room (as last seen by a join or poll).",
            ["sku"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.room_admitted = Counter(
            "flashsale_waiting_room_admitted",
            "People let through a sku's waiting room (rate() gives admitted/s).",
            ["sku"],
            registry=r,
        )
        self.admissions_refused = Counter(
            "flashsale_admissions_refused",
            "Purchases of waiting-room skus refused for their admission token, by reason.",
            ["reason"],
            registry=r,
        )
        skus.labelled(self.room_length, self.room_admitted)

    def room_seen(self, sku: str, waiting: int, admitted_now: int) -> None:
        """A join or poll saw ``waiting`` people in the room and let ``admitted_now`` in."""
        self._skus.seen(sku)
        self.room_length.labels(sku).set(waiting)
        if admitted_now:
            self.room_admitted.labels(sku).inc(admitted_now)

    def admission_refused(self, reason: str) -> None:
        """A purchase's admission token was refused (missing, forged, expired, used)."""
        self.admissions_refused.labels(reason).inc()


class ConnectionMetrics:
    """Connections the listener's limits closed (gateway.http.limits.LimitsObserver)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.connections_refused = Counter(
            "flashsale_connections_refused",
            "Connections closed at once because GATEWAY_MAX_CONNECTIONS were open.",
            registry=r,
        )
        self.read_timeouts = Counter(
            "flashsale_request_read_timeouts",
            "Connections dropped for not sending a request within GATEWAY_REQUEST_READ_TIMEOUT_S.",
            registry=r,
        )

    def connection_refused(self) -> None:
        """A connection beyond the cap was closed."""
        self.connections_refused.inc()

    def read_timed_out(self) -> None:
        """A connection was dropped for sending its request too slowly."""
        self.read_timeouts.inc()


class StreamMetrics:
    """The queue strategy's streams (length, pending entries, reclaims) and its
    writers' batches (gateway.write.writer.WriterObserver)."""

    def __init__(self, r: CollectorRegistry, skus: SkuSeries) -> None:
        self._skus = skus
        self.stream_length = Gauge(
            "flashsale_stream_length",
            "Queued purchases in a sku's stream, read or not (sampled by its writers).",
            ["sku"],
            registry=r,
            multiprocess_mode="max",
        )
        self.stream_pending = Gauge(
            "flashsale_stream_pending",
            "Stream entries a writer has read and not yet acknowledged.",
            ["sku"],
            registry=r,
            multiprocess_mode="max",
        )
        self.stream_reclaims = Counter(
            "flashsale_stream_reclaimed",
            "Stream entries claimed from a writer presumed dead (XAUTOCLAIM).",
            registry=r,
        )
        self.writer_batches = Counter(
            "flashsale_writer_batches",
            "Batches of stream entries a writer committed, or failed to.",
            ["result"],
            registry=r,
        )
        self.writer_batch_size = Histogram(
            "flashsale_writer_batch_size",
            "Stream entries per committed writer batch.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        skus.labelled(self.stream_length, self.stream_pending)

    def writer_batch(self, size: int, *, failed: bool) -> None:
        """A writer committed a batch of ``size`` entries, or failed one."""
        self.writer_batches.labels("failed" if failed else "committed").inc()
        if not failed:
            self.writer_batch_size.observe(size)

    def stream_reclaimed(self, count: int) -> None:
        """A writer claimed ``count`` entries of a dead one."""
        self.stream_reclaims.inc(count)

    def stream_depth(self, sku: str, length: int, pending: int) -> None:
        """A sku's stream length and pending entries, as a writer sampled them."""
        self._skus.seen(sku)
        self.stream_length.labels(sku).set(length)
        self.stream_pending.labels(sku).set(pending)


class OptimisticMetrics:
    """The optimistic strategy's races (gateway.strategies.optimistic.OptimisticObserver)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.optimistic_conflicts = Counter(
            "flashsale_optimistic_conflicts",
            "Optimistic UPDATEs that found the row at another version (nothing written).",
            registry=r,
        )
        self.optimistic_retries = Counter(
            "flashsale_optimistic_retries",
            "Optimistic purchases tried again after a conflict.",
            registry=r,
        )
        self.optimistic_exhausted_total = Counter(
            "flashsale_optimistic_exhausted",
            "Optimistic purchases answered 503: every attempt of the budget conflicted.",
            registry=r,
        )

    def optimistic_conflict(self) -> None:
        """An optimistic UPDATE lost the race for the row."""
        self.optimistic_conflicts.inc()

    def optimistic_retry(self) -> None:
        """An optimistic purchase is tried again."""
        self.optimistic_retries.inc()

    def optimistic_exhausted(self) -> None:
        """An optimistic purchase spent its budget of attempts."""
        self.optimistic_exhausted_total.inc()


class _SharedRequests:
    """With several workers: each answer also goes to prometheus-client's shared
    files, so a scrape of any worker sees every worker's counts at once."""

    def __init__(self, stats: RequestStats, registry: CollectorRegistry) -> None:
        self._stats = stats
        purchases = Counter(
            "flashsale_purchases", "Purchase requests by outcome.", ["outcome"], registry=registry
        )
        self._outcome = {o: purchases.labels(o) for o in OUTCOMES}
        self._duration = Histogram(
            REQUEST_DURATION,
            "Request latency by route and outcome.",
            ["route", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._latency: dict[tuple[str, str], Histogram] = {}

    def record(self, route: str, outcome: str, seconds: float) -> None:
        """One request answered; purchases also count by outcome."""
        self._stats.record(route, outcome, seconds)
        child = self._latency.get((route, outcome))
        if child is None:
            child = self._latency[(route, outcome)] = self._duration.labels(route, outcome)
        child.observe(seconds)
        if route == PURCHASE_ROUTE:
            counter = self._outcome.get(outcome)
            if counter is not None:
                counter.inc()
