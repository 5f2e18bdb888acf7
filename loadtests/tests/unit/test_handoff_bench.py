"""bench_handoff's arithmetic: medians a size and the line through them."""

from __future__ import annotations

import pytest

from loadtests.bench_handoff import fit, summary


def test_the_line_splits_a_pass_from_its_events() -> None:
    """100 µs a pass and 3 µs an event, read back from three sizes; one size
    alone is all events."""
    assert fit([(10, 130.0), (30, 190.0), (90, 370.0)]) == pytest.approx((100.0, 3.0))
    assert fit([(10, 130.0)]) == (0.0, 13.0)


def test_the_summary_takes_each_sizes_median_and_skips_an_unread_redis() -> None:
    """Three rounds of one size: the median per side; Redis not on this
    machine (None) leaves its line out."""
    cells = [
        {"round": r, "size": 10, "gateway_us": g, "redis_us": None}
        for r, g in enumerate((13.0, 12.0, 20.0))
    ] + [{"round": 0, "size": 20, "gateway_us": 8.0, "redis_us": None}]
    got = summary(cells)
    assert got["sizes"] == [
        {"size": 10, "gateway_us": 13.0, "redis_us": None},
        {"size": 20, "gateway_us": 8.0, "redis_us": None},
    ]
    assert got["line"]["gateway_us"] == pytest.approx({"pass_us": 100.0, "event_us": 3.0})
    assert "redis_us" not in got["line"]
