"""Plain-integer request counts: exposed at scrape time as the Counter and Histogram
they replace, and summed up for the overload log."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from structlog.testing import capture_logs

from gateway.ops.answer_log import AnswerLog
from gateway.ops.request_stats import RequestCollector, RequestStats
from testkit.metrics import samples

OUTCOMES = ("confirmed", "sold_out", "unavailable")
BOUNDS = (0.001, 0.01, 0.1)


def exposition(stats: RequestStats) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(RequestCollector(stats, purchases="p", duration="d_seconds"))
    return samples(generate_latest(registry).decode())


class TestRequestCollector:
    """What /metrics shows of the integer counts."""

    def test_buckets_are_cumulative_and_a_bound_belongs_to_its_bucket(self) -> None:
        """0.0005 and 0.001 fall in le=0.001 (le means "at most"), 0.05 in le=0.1,
        7 s only in +Inf; count and sum add up."""
        stats = RequestStats(OUTCOMES, BOUNDS)
        for seconds in (0.0005, 0.001, 0.05, 7.0):
            stats.record("/v1/purchase", "sold_out", seconds)
        found = exposition(stats)
        series = 'd_seconds_bucket{le="%s",outcome="sold_out",route="/v1/purchase"}'
        assert [found[series % le] for le in ("0.001", "0.01", "0.1", "+Inf")] == [2, 2, 3, 4]
        assert found['d_seconds_count{outcome="sold_out",route="/v1/purchase"}'] == 4
        assert found['d_seconds_sum{outcome="sold_out",route="/v1/purchase"}'] == 7.0515

    def test_purchases_count_by_outcome_other_routes_do_not(self) -> None:
        """Every outcome is exposed, zero included; answers of other routes and
        unknown outcomes are timed but not counted as purchases."""
        stats = RequestStats(OUTCOMES, BOUNDS)
        stats.record("/v1/purchase", "confirmed", 0.002)
        stats.count("/v1/purchase", "sold_out")
        stats.record("/healthz", "ok", 0.0001)
        stats.record("/v1/purchase", "unauthorized", 0.0001)
        found = exposition(stats)
        assert [found[f'p_total{{outcome="{o}"}}'] for o in OUTCOMES] == [1, 1, 0]
        assert found['d_seconds_count{outcome="ok",route="/healthz"}'] == 1


class TestAnswerLog:
    """Failure lines sampled per interval; the summary says what happened since the last."""

    def test_one_line_per_interval_and_the_rest_summed(self) -> None:
        """Ten failures in one interval log one line; the next interval logs again;
        the summary counts the lines left out and the outcomes recorded."""
        now = [100.0]
        stats = RequestStats(OUTCOMES, BOUNDS)
        answers = AnswerLog(stats, interval_s=1.0, clock=lambda: now[0])
        with capture_logs() as logs:
            for _ in range(10):
                stats.count("/v1/purchase", "unavailable")
                answers.failure(path="/v1/purchase", error="unavailable", cause="busy")
            now[0] += 1.0
            answers.failure(path="/v1/purchase", error="unavailable", cause="busy")
        assert [e["event"] for e in logs] == ["request_failed", "request_failed"]
        assert answers.summary() == {
            "sold_out": 0,
            "unavailable": 10,
            "rate_limited": 0,
            "client_gone": 0,
            "shed": 0,
            "failures_not_logged": 9,
        }
        assert answers.summary() is None
