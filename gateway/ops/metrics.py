"""Prometheus metrics: the three health signals of a flash sale and the rest.

The three signals are lock wait time, locks lost before release, and the
deduction failure rate (purchase outcomes and flush failures by reason).
Each application gets its own registry, so several apps can share a process
(tests do). Label children used on the hot path are bound once, up front.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.ops.lockmetrics import LockFamilies
from gateway.ops.request_stats import PURCHASE_ROUTE, RequestCollector, RequestStats
from gateway.ops.streammetrics import StreamFamilies

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
)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REQUEST_DURATION = "flashsale_request_duration_seconds"


class Metrics:
    """Every metric of one gateway; implements the service's observers. The lock's
    observer is :attr:`lock`, the queue writers' :attr:`streams`."""

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
            self._shared = _SharedRequests(self.stats, r)
            self.request = self._shared.record
        self.loop_lag = Histogram(
            "flashsale_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 100 ms (gateway.ops.loop_lag).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.loop_own_lag = Histogram(
            "flashsale_event_loop_own_lag_seconds",
            "That lag less the time the loop's thread waited for a CPU: what this"
            " process caused (a blocking call, a long computation), not the machine.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
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
        # The flush lock's families and observer (gateway.ops.lockmetrics).
        self.lock = LockFamilies(r, LATENCY_BUCKETS)
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
        self.reloads = Counter(
            "flashsale_stock_reloads", "Stock keys reloaded from the database.", registry=r
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
        self.rebuilds = Counter("flashsale_sale_rebuilds", "Lost sales rebuilt here.", registry=r)
        self.rebuild_seconds = Counter(
            "flashsale_sale_rebuild_seconds", "Time those rebuilds took (paced).", registry=r
        )
        self.noscript = Counter(
            "flashsale_noscript_reloads", "Scripts reloaded after NOSCRIPT.", ["script"], registry=r
        )
        self.backlog_depth = Gauge(
            "flashsale_queue_depth",
            "Purchases in the batcher's backlog: waiting for or in a flush.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.shed = Counter(
            "flashsale_shed", "Purchases refused with 503 because the backlog was full.", registry=r
        )
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
        # The queue strategy's streams and writers (gateway.ops.streammetrics).
        self.streams = StreamFamilies(r, BATCH_BUCKETS)
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

    def render(self) -> bytes:
        """The exposition text of every metric (of every worker, with several)."""
        if self._multiproc_dir is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=self._multiproc_dir)  # type: ignore[no-untyped-call]
        return generate_latest(merged)

    def sample_backlog(self, depth: int) -> None:
        """Record the batcher's backlog (sampled, not set on the hot path)."""
        self.backlog_depth.set(depth)

    def loop_lagged(self, seconds: float, own: float) -> None:
        """The loop ran its lag timer ``seconds`` late, ``own`` of them not
        waiting for a CPU."""
        self.loop_lag.observe(seconds)
        self.loop_own_lag.observe(own)

    # The service's observer.
    def flushed(self, size: int, seconds: float) -> None:
        """A batch committed and settled."""
        self.batch_size.observe(size)
        self.flush_duration.observe(seconds)

    def flush_failed(self, reason: str) -> None:
        """A batch failed and was given back."""
        self.flush_failures.labels(reason).inc()

    def stock_reloaded(self) -> None:
        """A missing stock key was loaded from the database."""
        self.reloads.inc()

    def rebuilt(self, orders: int, seconds: float) -> None:
        """A sku's buyers and done hashes were rebuilt from ``orders`` order rows."""
        self.rebuilds.inc()
        self.rebuild_seconds.inc(seconds)

    def confirmed_ids_built(self, count: int, seconds: float) -> None:
        """A sold-out sku's replay filter was built over ``count`` confirmed orders."""
        self.confirmed_id_builds.inc()
        self.confirmed_ids_read.inc(count)
        self.confirmed_id_build_seconds.inc(seconds)

    def shed_one(self) -> None:
        """A purchase was refused because the backlog was full."""
        self.shed.inc()
        self.stats.shed += 1

    # The waiting rooms' observer (gateway.usecases.admission.AdmissionObserver).
    def room_seen(self, sku: str, waiting: int, admitted_now: int) -> None:
        """A join or poll saw ``waiting`` people queued and let ``admitted_now`` in."""
        self.room_length.labels(sku).set(waiting)
        if admitted_now:
            self.room_admitted.labels(sku).inc(admitted_now)

    def admission_refused(self, reason: str) -> None:
        """A purchase's admission token was refused (missing, forged, expired, used)."""
        self.admissions_refused.labels(reason).inc()

    # The listener limits' observer (gateway.http.limits.LimitsObserver).
    def connection_refused(self) -> None:
        """A connection beyond the cap was closed."""
        self.connections_refused.inc()

    def read_timed_out(self) -> None:
        """A connection was dropped for sending its request too slowly."""
        self.read_timeouts.inc()

    def noscript_reload(self, script: str) -> None:
        """Redis had forgotten a script."""
        self.noscript.labels(script).inc()

    def sku_state(self, sku: str, pending: int, drift: int) -> None:
        """What the reconciler found for a sku."""
        self.pending.labels(sku).set(pending)
        self.drift.labels(sku).set(drift)

    def fenced_out(self) -> None:
        """A flush was fenced out."""
        self.lock.fenced_out()

    # The optimistic strategy's observer (gateway.strategies.optimistic).
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
