"""The flush lock's metrics: wait, acquisitions, timeouts, renewals, losses, fencing,
and the hold time and lease the lease rule of thumb compares (gateway/write/lease_rule.py).

:class:`LockFamilies` implements the lock's observer (``gateway.lock.LockMetrics``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class LockFamilies:
    """The lock's metric families in one registry; the lock's observer."""

    def __init__(self, r: CollectorRegistry, latency: tuple[float, ...]) -> None:
        # Lock holds: fine where flushes are, coarse up to the largest sensible lease.
        hold_buckets = (*latency, 10.0, 30.0, 60.0)
        self.lock_wait = Histogram(
            "flashsale_lock_wait_seconds",
            "Wait to acquire a flush lock.",
            buckets=latency,
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
        # The lease rule of thumb (gateway/write/lease_rule.py): p99 hold against lease / 3.
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

    def acquired(self, wait_s: float, contended: bool) -> None:
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
