"""The lease rule of thumb: a flush lock's lease is at least three times its peak hold.

The design note sizes the lease at three times the longest a holder needs: a lease
close to the hold expires under a stalled holder (a pause, a slow commit) and two
flushers overlap, which only the fence then catches. Each sku's lock reports its
holds here; when the p99 of the sku's recent holds passes a third of the lease, a
warning names the sku, the p99 and the lease, at most once a minute per sku. The
Prometheus rule ``FlashsaleLockHoldNearLease`` (deploy/rules/locks.yml) says the
same across instances from ``flashsale_lock_hold_seconds``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

import structlog

from gateway.lock import LockMetrics

log = structlog.get_logger(__name__)

# Holds of a sku the p99 is taken over: the last this many.
WINDOW = 256
# Below this many holds a p99 means little (it is the maximum): no verdict yet.
MIN_HOLDS = 20
WARN_EVERY_S = 60.0


class LeaseRule:
    """Watches each sku's hold times against a third of the lease.

    Args:
        lease_s: the flush lock's lease.
        clock: monotonic seconds (a test passes its own).
    """

    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = lease_s / 3
        self.lease_s = lease_s
        self._clock = clock
        self._holds: dict[str, deque[float]] = {}
        self._warned_at: dict[str, float] = {}

    def observe(self, sku: str, held_s: float) -> None:
        """Record one hold of ``sku``'s lock; warn if its p99 now breaks the rule."""
        holds = self._holds.get(sku)
        if holds is None:
            holds = self._holds[sku] = deque(maxlen=WINDOW)
        holds.append(held_s)
        # The p99 can only be above the limit while holds above it keep coming: only
        # such a hold pays for the sort.
        if held_s <= self.limit_s or len(holds) < MIN_HOLDS:
            return
        now = self._clock()
        last = self._warned_at.get(sku)
        if last is not None and now - last < WARN_EVERY_S:
            return
        p99 = percentile(holds, 0.99)
        if p99 > self.limit_s:
            self._warned_at[sku] = now
            log.warning(
                "lock_hold_near_lease",
                sku=sku,
                hold_p99_s=round(p99, 4),
                lease_s=self.lease_s,
                advice="raise GATEWAY_LOCK_LEASE_S to three times the peak hold",
            )

    def metrics_for(self, sku: str, inner: LockMetrics) -> LockMetrics:
        """``inner``, also reporting ``sku``'s holds to this rule."""
        return _Watched(inner, sku, self)


def percentile(values: deque[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class _Watched:
    """A sku's :class:`LockMetrics`: everything to ``inner``, holds also to the rule."""

    __slots__ = ("_inner", "_rule", "_sku")

    def __init__(self, inner: LockMetrics, sku: str, rule: LeaseRule) -> None:
        self._inner, self._sku, self._rule = inner, sku, rule

    def acquired(self, wait_s: float, *, contended: bool) -> None:
        self._inner.acquired(wait_s, contended=contended)

    def released(self, held_s: float) -> None:
        self._inner.released(held_s)
        self._rule.observe(self._sku, held_s)

    def timed_out(self) -> None:
        self._inner.timed_out()

    def renewed(self) -> None:
        self._inner.renewed()

    def renewal_failed(self) -> None:
        self._inner.renewal_failed()

    def lost(self) -> None:
        self._inner.lost()

    def fenced_out(self) -> None:
        self._inner.fenced_out()
