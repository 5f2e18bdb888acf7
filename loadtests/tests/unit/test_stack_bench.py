"""The stack bench's arithmetic: CPU of a process tree whose children come and go,
the lag percentiles, the rounds' order and the report's figures."""

from __future__ import annotations

import os
from typing import Any

from loadtests.bench_stack import parse_mode, schedule
from loadtests.lib.proc_cpu import REAPED, Snapshot, snapshot, spent
from loadtests.lib.stack_report import (
    events_cost,
    format_table,
    idle_table,
    median_interval,
    mode_rows,
    problems,
)
from loadtests.lib.stream_lag import percentiles


class TestSpent:
    """What a tree spent between two snapshots, whatever came and went."""

    def test_a_live_process_counts_its_difference(self) -> None:
        """A process in both snapshots counts what it ran in between."""
        before = Snapshot({1: 1.0, 2: 0.5}, {1: "postmaster", 2: "walwriter"}, 0.0)
        after = Snapshot({1: 1.25, 2: 0.75}, {1: "postmaster", 2: "walwriter"}, 0.0)
        assert spent(before, after) == {"postmaster": 0.25, "walwriter": 0.25}

    def test_a_reaped_child_counts_only_its_life_in_the_window(self) -> None:
        """A child seen before and reaped since: its whole life lands in the parent's
        cutime, less what the first snapshot had already seen of it."""
        before = Snapshot({1: 1.0, 3: 2.0}, {1: "postmaster", 3: "autovacuum worker"}, 10.0)
        after = Snapshot({1: 1.0}, {1: "postmaster"}, 12.5)  # child 3 lived 2.5 s in all
        assert spent(before, after) == {REAPED: 0.5}

    def test_a_child_born_in_the_window_counts_whole(self) -> None:
        """A backend that connected during the window counts all it ran."""
        before = Snapshot({1: 1.0}, {1: "postmaster"}, 0.0)
        after = Snapshot({1: 1.0, 4: 0.125}, {1: "postmaster", 4: "backend"}, 0.0)
        assert spent(before, after, lambda _pid, title: title.upper()) == {"BACKEND": 0.125}

    def test_this_process_can_be_read(self) -> None:
        """A live process has a positive CPU time and a title."""
        shot = snapshot(os.getpid())
        assert shot.ok and shot.total() > 0 and shot.names[os.getpid()]


def test_percentiles_are_nearest_rank() -> None:
    """p50 and p99 of 1..100 are 50 and 99; nothing read gives a count of 0."""
    got = percentiles([float(v) for v in range(100, 0, -1)])
    assert (got["count"], got["p50"], got["p99"], got["max"]) == (100, 50.0, 99.0, 100.0)
    assert percentiles([]) == {"count": 0}


def test_rounds_alternate_and_flip() -> None:
    """Relay on and off alternate, the pair's order flipped every round."""
    assert schedule(2) == [(0, "relay_on"), (0, "relay_off"), (1, "relay_off"), (1, "relay_on")]


def _round(mode: str, n: int, gateway_s: float, rps: float, **extra: Any) -> dict[str, Any]:
    return {
        "mode": mode,
        "round": n,
        "orders": 10_000,
        "wrk": {"rps": rps, "latency_ms": {"p99": 20.0}, "errors": 0, "statuses": {"201": 1}},
        "cpu_s": {
            "gateway": {"gateway": gateway_s},
            "postgres": {"client backends": 0.4, "walwriter": 0.01},
            "redis": {"redis": 0.19},
        },
        "owed_after": 0,
        "lag_ms": {"count": 10, "p50": 40.0, "p99": 120.0} if mode == "relay_on" else {},
        **extra,
    }


def _bare(rps: float, cpu: float) -> dict[str, Any]:
    return {
        "rps": rps,
        "requests": int(rps),
        "latency_ms": {"p99": 4.0},
        "extra": {"cpu_us_per_request": cpu},
    }


RESULTS = {
    "bare": [_bare(30_000, 30.0), _bare(34_000, 32.0), _bare(32_000, 31.0)],
    "rounds": [_round("relay_on", 0, 0.9, 6_400.0), _round("relay_off", 0, 0.7, 8_000.0)],
}


class TestReport:
    """The table's figures, from rounds and the bare runs around each."""

    def test_per_order_and_ratios_to_the_bare_runs_around(self) -> None:
        """µs per order per group and in all; req/s and CPU to the bare runs on either side."""
        on = next(r for r in mode_rows(RESULTS) if r["target"] == "relay on")
        assert on["gateway"] == [90.0]
        assert round(on["postgres"][0], 6) == 41.0 and on["redis"] == [19.0]
        assert round(on["total"][0], 6) == 150.0
        assert on["to_bare"] == [6_400.0 / 32_000.0]
        assert round(on["cpu_to_bare"][0], 6) == round(150.0 / 31.0, 6)
        assert on["lag_p99"] == [120.0]

    def test_table_and_events_cost(self) -> None:
        """One row per target; the events' cost paired by round, against the 5 % target."""
        table = format_table(mode_rows(RESULTS))
        assert table.count("\n") == 4 and "| relay off | 1 | 8,000 |" in table
        assert (
            "relay on, paired with the same round's relay off: 20.0 µs of CPU per order more, "
            "15.4 % (over the 5 % target; the median's 95 % interval 15.4 to 15.4 %)"
            in events_cost(RESULTS)
        )

    def test_the_idle_stack_by_process_and_paired_by_round(self) -> None:
        """With --idle each process's ms a second per mode, their total, and a
        relayed mode's idle cost paired with the same round's relay off; without
        it, no table."""
        assert idle_table(RESULTS) == ""
        idle = {"gateway": 16.0, "postgres": 7.0, "redis": 2.0}
        rounds = [
            _round("relay_on", 0, 0.9, 6_400.0, idle_ms_s=idle),
            _round("relay_off", 0, 0.7, 8_000.0, idle_ms_s={**idle, "gateway": 10.0}),
            _round("relay_off", 1, 0.7, 8_000.0, idle_ms_s={**idle, "postgres": 4.0}),
            _round("relay_on", 1, 0.9, 6_400.0, idle_ms_s={**idle, "gateway": 18.0}),
        ]
        table = idle_table({**RESULTS, "rounds": rounds})
        assert "| gateway | 17.0 (16.0-18.0) | 13.0 (10.0-16.0) |" in table
        assert "| total | 26.0 (25.0-27.0) | 20.5 (19.0-22.0) |" in table
        assert table.endswith(
            "relay on idle, paired with the same round's relay off: "
            "5.5 (5.0-6.0) ms of CPU a second more"
        )

    def test_events_left_owed_are_a_problem(self) -> None:
        """A relay that did not catch up is reported: the CPU would be undercounted."""
        late = {**RESULTS, "rounds": [_round("relay_on", 0, 0.9, 6_400.0, owed_after=12)]}
        assert problems(late) == ["relay_on round 0: 12 events still owed after the catch-up"]


def test_the_medians_interval_holds_the_median_and_widens_with_the_spread() -> None:
    """Pairs all alike: an interval of that value alone; pairs spread from -10
    to +30 %: an interval round their median (10), within the pairs' range and
    wider than nothing, the same from one call to the next."""
    assert median_interval([4.0] * 9) == (4.0, 4.0)
    spread = [-10.0, -5.0, 0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0]
    low, high = median_interval(spread)
    assert -10.0 <= low < 10.0 < high <= 30.0
    assert median_interval(spread) == (low, high)


def test_a_further_mode_joins_the_rotation() -> None:
    """--mode adds a mode of its own settings, alternating with the two."""
    name, settings = parse_mode("batch1k=GATEWAY_EVENTS_BATCH=1024,GATEWAY_EVENTS_POLL_S=0.5")
    assert (name, settings) == (
        "batch1k",
        {"GATEWAY_EVENTS_BATCH": "1024", "GATEWAY_EVENTS_POLL_S": "0.5"},
    )
    assert schedule(2, ["a", "b", "c"]) == [
        (0, "a"),
        (0, "b"),
        (0, "c"),
        (1, "c"),
        (1, "b"),
        (1, "a"),
    ]
