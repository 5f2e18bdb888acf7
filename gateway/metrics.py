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

from gateway.requeststats import PURCHASE_ROUTE, RequestCollector, RequestStats

OUTCOMES = (
    "confirmed",
    "sold_out",
    "duplicate",
    "in_progress",
    "invalid",
    "unavailable",
    "rate_limited",
)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REQUEST_DURATION = "flashsale_request_duration_seconds"


class Metrics:
    """Every metric of one gateway; implements the service and lock observers."""

    def __init__(self, multiproc_dir: str | None = None) -> None:
        # With several workers every value lives in files under multiproc_dir
        # (prometheus-client's multiprocess mode) and a scrape adds them up.
        self._multiproc_dir = multiproc_dir
        self.registry = r = CollectorRegistry(auto_describe=True)
        # Purchases by outcome and request latency are plain integers in one
        # process, summed at scrape time (gateway.requeststats); with several
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
        self.noscript = Counter(
            "flashsale_noscript_reloads", "Scripts reloaded after NOSCRIPT.", ["script"], registry=r
        )
        self.queue_depth = Gauge(
            "flashsale_queue_depth",
            "Purchases queued for or in a flush.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.shed = Counter(
            "flashsale_shed", "Purchases refused with 503 because the queue was full.", registry=r
        )

    def render(self) -> bytes:
        """The exposition text of every metric (of every worker, with several)."""
        if self._multiproc_dir is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=self._multiproc_dir)  # type: ignore[no-untyped-call]
        return generate_latest(merged)

    def sample_queue(self, depth: int) -> None:
        """Record the current queue depth (sampled, not set on the hot path)."""
        self.queue_depth.set(depth)

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

    def confirmed_ids_built(self, count: int, seconds: float) -> None:
        """A sold-out sku's replay filter was built over ``count`` confirmed orders."""
        self.confirmed_id_builds.inc()
        self.confirmed_ids_read.inc(count)
        self.confirmed_id_build_seconds.inc(seconds)

    def shed_one(self) -> None:
        """A purchase was refused because the queue was full."""
        self.shed.inc()
        self.stats.shed += 1

    def noscript_reload(self, script: str) -> None:
        """Redis had forgotten a script."""
        self.noscript.labels(script).inc()

    def sku_state(self, sku: str, pending: int, drift: int) -> None:
        """What the reconciler found for a sku."""
        self.pending.labels(sku).set(pending)
        self.drift.labels(sku).set(drift)

    # The lock's observer (gateway.lock.LockMetrics).
    def acquired(self, wait_s: float, contended: bool) -> None:
        """A first acquisition after ``wait_s`` seconds."""
        self.lock_wait.observe(wait_s)
        self.lock_acquisitions.labels("true" if contended else "false").inc()

    def released(self, held_s: float) -> None:
        """A normal release (held time is not exported)."""

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
