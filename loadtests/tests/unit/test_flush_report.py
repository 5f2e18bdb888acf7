"""The flush bench's arithmetic: drains summed up per lock mode and batch size,
the order drains run in, and the tables."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from loadtests.lib.cputime import run_and_queued
from loadtests.lib.flush_report import (
    Drain,
    best,
    schedule,
    split_table,
    summarize,
    throughput_table,
)

# 4 batches of 100 in 20 ms: 20,000 orders/s, 5 ms a batch.
DRAIN = Drain(
    mode="slice",
    batch=100,
    round=0,
    batches=4,
    wall_s=0.020,
    lock_s=0.002,
    sql_s=0.012,
    settle_s=0.004,
    cpu_s=0.004,
    queued_s=0.0008,
    pg_cpu_s=0.010,
    redis_cpu_s=0.002,
)


def test_a_drain_counts_its_orders_per_second() -> None:
    """Orders are batches times batch size, over the wall time."""
    assert DRAIN.orders == 400
    assert DRAIN.per_s == pytest.approx(20_000)


def test_a_row_takes_the_median_and_the_range_over_rounds() -> None:
    """Orders/s is the median with min and max; the time per batch and its parts
    are per batch, the CPU per order, and what no timer saw is the rest."""
    drains = [
        DRAIN,
        replace(DRAIN, round=1, wall_s=0.040),
        replace(DRAIN, round=2, wall_s=0.016),
    ]
    (row,) = summarize(drains)
    assert (row.mode, row.batch, row.rounds) == ("slice", 100, 3)
    assert row.per_s == pytest.approx(20_000)
    assert (row.per_s_min, row.per_s_max) == pytest.approx((10_000, 25_000))
    assert row.batch_ms == pytest.approx(5.0)
    assert (row.lock_ms, row.sql_ms, row.settle_ms) == pytest.approx((0.5, 3.0, 1.0))
    assert row.other_ms == pytest.approx(0.5)
    assert row.queued_ms == pytest.approx(0.2)
    assert row.row_us == pytest.approx(30.0)
    assert row.cpu_us == pytest.approx(10.0)
    assert row.pg_cpu_us == pytest.approx(25.0)
    assert row.redis_cpu_us == pytest.approx(5.0)


def test_a_process_whose_cpu_could_not_be_read_has_no_figure() -> None:
    """One drain without PostgreSQL's CPU leaves that column empty, not wrong."""
    (row,) = summarize([DRAIN, replace(DRAIN, round=1, pg_cpu_s=None)])
    assert row.pg_cpu_us is None
    assert row.redis_cpu_us == pytest.approx(5.0)


def test_rows_come_in_mode_order_then_by_batch_size() -> None:
    """per-batch, slice, none; small batches first, whatever order they ran in."""
    drains = [
        replace(DRAIN, mode="none", batch=64),
        replace(DRAIN, mode="slice", batch=64),
        replace(DRAIN, mode="none", batch=32),
        replace(DRAIN, mode="per-batch", batch=64),
    ]
    found = [(r.mode, r.batch) for r in summarize(drains)]
    assert found == [("per-batch", 64), ("slice", 64), ("none", 32), ("none", 64)]


def test_best_is_the_fastest_batch_size_of_a_mode() -> None:
    """The highest median orders/s of the mode; None for a mode not run."""
    rows = summarize([DRAIN, replace(DRAIN, batch=200, wall_s=0.020)])
    top = best(rows, "slice")
    assert top is not None and top.batch == 200
    assert best(rows, "none") is None


def test_each_round_shifts_the_order_by_an_equal_share() -> None:
    """Every (mode, size) once a round; the start moves by a round's share."""
    modes, sizes = ("per-batch", "none"), (32, 64)
    first = schedule(0, 2, modes, sizes)
    second = schedule(1, 2, modes, sizes)
    assert first == [("per-batch", 32), ("none", 32), ("per-batch", 64), ("none", 64)]
    assert second == [("per-batch", 64), ("none", 64), ("per-batch", 32), ("none", 32)]


def test_the_throughput_table_prices_the_lock() -> None:
    """A column per mode, a row per size, and the lockless median over each locked one."""
    drains = [
        replace(DRAIN, mode="slice", wall_s=0.040),
        replace(DRAIN, mode="none", wall_s=0.020),
    ]
    lines = throughput_table(summarize(drains)).splitlines()
    assert lines[0] == "| batch | slice orders/s | none orders/s | none / slice |"
    assert lines[2] == "| 100 | 10,000 (10,000-10,000) | 20,000 (20,000-20,000) | 2.00x |"


def test_the_split_table_has_a_line_per_mode_and_size() -> None:
    """The time per batch and its parts, and the CPU per order of each process."""
    lines = split_table(summarize([DRAIN, replace(DRAIN, redis_cpu_s=None)])).splitlines()
    assert len(lines) == 3
    assert lines[2] == (
        "| slice | 100 | 5.00 | 0.50 | 3.00 | 1.00 | 0.50 | 0.20 | 30.0 | 10.0 | 25.0 | - |"
    )


def test_schedstat_reads_a_live_process_and_none_for_a_missing_one() -> None:
    """This process has run; a pid that cannot exist gives None, not an error."""
    own = run_and_queued(os.getpid())
    assert own is not None and own[0] > 0 and own[1] >= 0
    assert run_and_queued(-1) is None
