"""Metrics of the order events (``gateway.usecases.relay``): each sink's outbox
depth, dead letters and oldest owed event, the delivery lag, and the webhook's
answers by class.

Kept apart from ``gateway.ops.metrics``, whose observers are the purchase's.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.domain.events import SinkStats

# From an event's commit to its sink: milliseconds when all is well, minutes to
# days while a receiver is down (a webhook is retried for up to 3 days).
LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
# What open_sinks reports of each webhook answer (gateway.outbound).
ANSWER_CLASSES = ("2xx", "3xx", "4xx", "5xx", "timeout", "error")


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for each of ``values``, as one increment of each
    bucket reached and one of the sum.

    Reaches past prometheus_client's API (its bounds, bucket and sum values;
    pinned, and held by tests/unit/test_library_reaches.py): ``observe`` costs
    1.7 µs a value (a lock and a walk of the bounds), and the relay observes
    every event it delivers, a few hundred a claim. Its values (MutexValue, or
    MmapedValue with several workers) take counts as ``observe`` gives them ones.
    """
    bounds: Sequence[float] = histogram._upper_bounds
    counts = [0] * len(bounds)
    for value in values:
        # observe's bucket: the first whose bound is at least the value (the
        # last is +Inf).
        counts[bisect_left(bounds, value)] += 1
    histogram._sum.inc(sum(values))
    for bucket, count in zip(histogram._buckets, counts, strict=True):
        if count:
            bucket.inc(count)


class EventMetrics:
    """The outbox's backlog per sink, the delivery lag, the webhook's answers."""

    def __init__(self, r: CollectorRegistry) -> None:
        self._depth = Gauge(
            "flashsale_outbox_depth",
            "Events owed to a sink and not dead-lettered (PostgreSQL, sampled by the relay).",
            ["sink"],
            registry=r,
            multiprocess_mode="max",
        )
        self._dead = Gauge(
            "flashsale_outbox_dead_letters",
            "Events a sink was owed past its max age, until redelivered.",
            ["sink"],
            registry=r,
            multiprocess_mode="max",
        )
        self._oldest = Gauge(
            "flashsale_outbox_oldest_age_seconds",
            "Age of the oldest event owed to a sink and not dead-lettered; 0 when none is.",
            ["sink"],
            registry=r,
            multiprocess_mode="max",
        )
        self._lag = Histogram(
            "flashsale_event_delivery_lag_seconds",
            "From an event's occurred_at to its delivery to a sink (PostgreSQL's clock).",
            ["sink"],
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self._failed = Counter(
            "flashsale_event_delivery_failures",
            "Attempts a sink refused or that failed, each retried after a backoff.",
            ["sink"],
            registry=r,
        )
        self._answers = Counter(
            "flashsale_webhook_answers",
            "The webhook receiver's answers by class (2xx, 3xx, 4xx, 5xx, timeout, error).",
            ["class"],
            registry=r,
        )
        for klass in ANSWER_CLASSES:
            self._answers.labels(klass)

    def delivered(self, sink: str, lags_s: Sequence[float]) -> None:
        """Events delivered to ``sink``, each ``lag`` after it occurred."""
        observe_many(self._lag.labels(sink), [max(lag, 0.0) for lag in lags_s])

    def failed(self, sink: str, count: int) -> None:
        """``count`` attempts ``sink`` refused, to be tried again."""
        self._failed.labels(sink).inc(count)

    def sample(self, stats: Sequence[SinkStats]) -> None:
        """Each sink's backlog now."""
        for s in stats:
            self._depth.labels(s.sink).set(s.depth)
            self._dead.labels(s.sink).set(s.dead)
            self._oldest.labels(s.sink).set(s.oldest_s)

    def webhook_answer(self, klass: str) -> None:
        """One webhook answer of class ``klass`` (``open_sinks``'s ``on_answer``)."""
        self._answers.labels(klass).inc()
