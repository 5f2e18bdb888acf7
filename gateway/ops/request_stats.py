"""Per-request counts kept as plain integers, turned into Prometheus families at scrape time.

The hot path does an integer increment and a bisect per request instead of a
``prometheus_client`` child's locked ``inc``/``observe``; the sums and the
cumulative buckets are worked out only when ``/metrics`` is read, which is a
few times a minute against thousands of requests a second. The counts are
also what the overload summary (gateway.ops.answer_log) reads, metrics on or off.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

PURCHASE_ROUTE = "/v1/purchase"


class _Series:
    """One (route, outcome)'s latency: a count per bucket (the last is +Inf) and the sum."""

    __slots__ = ("counts", "total")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)
        self.total = 0.0


class RequestStats:
    """Purchase outcomes and request latencies as plain integers.

    ``outcomes`` are the purchase route's answers by outcome; ``record`` also
    keeps a latency histogram per (route, outcome) with ``bounds`` as upper
    bucket bounds.
    """

    def __init__(self, outcomes: Sequence[str], bounds: Sequence[float]) -> None:
        self.outcomes: dict[str, int] = dict.fromkeys(outcomes, 0)
        self.shed = 0
        self.bounds = tuple(bounds)
        self._series: dict[str, dict[str, _Series]] = {}

    def count(self, route: str, outcome: str) -> None:
        """One answer, untimed (metrics off): only purchases are counted."""
        if route == PURCHASE_ROUTE and outcome in self.outcomes:
            self.outcomes[outcome] += 1

    def record(self, route: str, outcome: str, seconds: float) -> None:
        """One answer that took ``seconds``."""
        by_outcome = self._series.get(route)
        if by_outcome is None:
            by_outcome = self._series[route] = {}
        series = by_outcome.get(outcome)
        if series is None:
            series = by_outcome[outcome] = _Series(len(self.bounds))
        # bisect_left: a value equal to a bound belongs to that bucket (le).
        series.counts[bisect_left(self.bounds, seconds)] += 1
        series.total += seconds
        if route == PURCHASE_ROUTE and outcome in self.outcomes:
            self.outcomes[outcome] += 1

    def series(self) -> Iterator[tuple[str, str, list[int], float]]:
        """(route, outcome, count per bucket, sum) of every latency series so far."""
        for route, by_outcome in self._series.items():
            for outcome, s in by_outcome.items():
                yield route, outcome, s.counts, s.total


class RequestCollector:
    """A Prometheus collector exposing a :class:`RequestStats` under the names the
    ``Counter`` and ``Histogram`` it replaces had."""

    def __init__(self, stats: RequestStats, *, purchases: str, duration: str) -> None:
        self._stats = stats
        self._purchases = purchases
        self._duration = duration

    def collect(self) -> Iterator[Metric]:
        """The purchases counter and the latency histogram, summed now."""
        counter = CounterMetricFamily(
            self._purchases, "Purchase requests by outcome.", labels=["outcome"]
        )
        for outcome, n in self._stats.outcomes.items():
            counter.add_metric([outcome], n)
        yield counter
        histogram = HistogramMetricFamily(
            self._duration, "Request latency by route and outcome.", labels=["route", "outcome"]
        )
        # floatToGoString is untyped; it writes "le" as the Histogram it replaces did.
        bounds = [*(floatToGoString(b) for b in self._stats.bounds), "+Inf"]  # type: ignore[no-untyped-call]
        for route, outcome, counts, total in self._stats.series():
            cumulative, buckets = 0, []
            for bound, n in zip(bounds, counts, strict=True):
                cumulative += n
                buckets.append((bound, float(cumulative)))
            histogram.add_metric([route, outcome], buckets, total)
        yield histogram
