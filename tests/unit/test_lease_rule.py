"""The lease rule of thumb: a warning when a sku's p99 hold passes a third of the
lease, at most once a minute per sku, and never for holds within the rule."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from structlog.testing import capture_logs

from gateway.lock import LockStats
from gateway.write.lease_rule import MIN_HOLDS, WARN_EVERY_S, LeaseRule


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def warnings(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == "lock_hold_near_lease"]


def test_holds_within_a_third_of_the_lease_never_warn() -> None:
    """Holds of up to lease/3 (3 s of a 9 s lease) say nothing, however many."""
    rule = LeaseRule(9.0, clock=Clock())
    with capture_logs() as logs:
        for _ in range(500):
            rule.observe("a", 3.0)
    assert warnings(logs) == []


def test_a_p99_above_a_third_warns_once_a_minute_per_sku() -> None:
    """Every hold over the limit: one warning naming sku, p99 and lease; silence for a
    minute; another after it; another sku warns on its own."""
    clock = Clock()
    rule = LeaseRule(9.0, clock=clock)
    with capture_logs() as logs:
        for _ in range(MIN_HOLDS * 3):
            rule.observe("a", 4.0)
        clock.now += WARN_EVERY_S - 1
        rule.observe("a", 4.0)
        first = warnings(logs)
        clock.now += 1
        rule.observe("a", 4.0)
        for _ in range(MIN_HOLDS):
            rule.observe("b", 5.0)
    assert len(first) == 1
    assert first[0]["sku"] == "a" and first[0]["hold_p99_s"] == 4.0
    assert first[0]["lease_s"] == 9.0 and first[0]["log_level"] == "warning"
    assert [w["sku"] for w in warnings(logs)] == ["a", "a", "b"]


def test_rare_slow_holds_below_one_percent_do_not_warn() -> None:
    """One slow hold among 256 is above the p99, not at it: no warning."""
    rule = LeaseRule(9.0, clock=Clock())
    with capture_logs() as logs:
        for _ in range(255):
            rule.observe("a", 0.01)
        rule.observe("a", 8.0)
    assert warnings(logs) == []


def test_the_sku_metrics_pass_everything_on_and_report_holds() -> None:
    """A sku's lock metrics reach the shared metrics unchanged, holds also the rule."""
    inner = LockStats()
    rule = LeaseRule(0.3, clock=Clock())
    watched = rule.metrics_for("a", inner)
    with capture_logs() as logs:
        watched.acquired(0.5, contended=True)
        watched.timed_out()
        watched.renewed()
        watched.renewal_failed()
        watched.lost()
        watched.fenced_out()
        for _ in range(MIN_HOLDS):
            watched.released(0.2)
    assert (inner.acquisitions, inner.contended, inner.timeouts) == (1, 1, 1)
    assert (inner.renewals, inner.renewal_failures, inner.losses) == (1, 1, 1)
    assert (inner.fenced_outs, inner.releases) == (1, MIN_HOLDS)
    assert len(warnings(logs)) == 1
