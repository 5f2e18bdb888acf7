"""The comparison's report: which combinations run, the table, the skipped list, the
observations, and the hand-written recommendation kept across regenerations."""

from __future__ import annotations

from typing import Any

from loadtests.lib.compare_report import BEGIN, END, HEADER, document, observations, table
from loadtests.lib.compare_round import matrix


def row(strategy: str, lock: str, condition: str, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "strategy": strategy,
        "lock": lock,
        "condition": condition,
        "confirmed_per_s": 1234.5,
        "latency_ms": {"p50": 1.25, "p99": 12.5, "p99.9": 250.0},
        "lock_wait_ms": {"mean": 0.5, "p99": 5.0},
        "locks_lost": 0.0,
        "fenced_out": 0.0,
        "flush_failures": {},
        "failure_rate": 0.0,
        "retries": 0.0,
        "oversell": 0,
        "unsold": 0,
        "lost": 0,
        "audit_exit": 0,
    }
    return {**base, **overrides}


def test_lockless_strategies_run_once_without_a_lock() -> None:
    """sql-direct, optimistic and pessimistic pair only with none; the batch
    strategies with every family asked for."""
    pairs = matrix(["reserve-batch", "sql-direct", "queue"], ["redis", "zookeeper", "none"])
    assert pairs == [
        ("reserve-batch", "redis"),
        ("reserve-batch", "zookeeper"),
        ("reserve-batch", "none"),
        ("sql-direct", "none"),
        ("queue", "redis"),
        ("queue", "zookeeper"),
        ("queue", "none"),
    ]


def test_the_table_has_one_line_per_measured_row_and_every_column() -> None:
    """Skipped rows stay out of the table; each line has as many cells as the header."""
    rows = [
        row("reserve-batch", "redis", "none"),
        row(
            "reserve-batch",
            "zookeeper",
            "stall",
            locks_lost=1.0,
            flush_failures={"lock_unavailable": 2.0, "error": 1.0},
            failure_rate=0.0749,
            latency_ms={"p50": 1.0, "p99": 1053.1, "p99.9": float("inf")},
            audit_exit=1,
        ),
        {"strategy": "queue", "lock": "redis", "condition": "none", "skipped": "no"},
    ]
    lines = table(rows).splitlines()
    assert lines[0] == HEADER and len(lines) == 4
    cells = [len(line.split("|")) for line in lines]
    assert len(set(cells)) == 1, cells
    assert "| reserve-batch | redis | none | 1,234 | 1.2 | 12.5 | 250 | 0.5 / 5.0 |" in lines[2]
    stalled = lines[3]
    assert "| 1,053 | >5000 |" in stalled
    assert "| error 1, lock_unavailable 2 | 7.5% |" in stalled
    assert stalled.endswith("| exit 1 |")


def test_observations_name_the_fastest_and_any_oversell() -> None:
    """The fastest row per condition is named; a row that oversold is called out."""
    rows = [
        row("reserve-batch", "redis", "none", confirmed_per_s=5000.0),
        row("reserve-batch", "zookeeper", "none", confirmed_per_s=900.0),
        row("reserve-batch", "none", "failover", oversell=2, lost=-2),
    ]
    text = observations(rows)
    assert "Fastest under `none`: `reserve-batch` with `redis`, 5,000 confirmed/s" in text
    assert "**Oversold or lost stock:** `reserve-batch/none/failover`" in text
    clean = observations(rows[:2])
    assert "none in any row" in clean


def test_a_hand_written_recommendation_survives_regeneration() -> None:
    """The text between the markers of the previous doc is kept; the rest is new."""
    rows = [
        row("reserve-batch", "redis", "none"),
        {"strategy": "sql-direct", "lock": "none", "condition": "none", "skipped": "unknown"},
        {"strategy": "sql-direct", "lock": "none", "condition": "stall", "skipped": "unknown"},
    ]
    kwargs: dict[str, Any] = {
        "machine": {"nproc": 2, "python": "3.11.7"},
        "pinning": "unpinned",
        "command": "make compare",
        "options": {"stock": 1000, "connections": 32, "seconds": 3.0},
        "seconds": 42.0,
        "chart": True,
    }
    first = document(rows, previous=None, **kwargs)
    assert "![confirmed/s per combination and condition](strategies.png)" in first
    assert "- `sql-direct` / `none` (none, stall): unknown" in first
    mine = first.replace(first.split(BEGIN)[1].split(END)[0], "\nUse reserve-batch.\n")
    again = document(rows, previous=mine, **kwargs)
    assert f"{BEGIN}\nUse reserve-batch.\n{END}" in again


def test_a_gateway_that_completed_nothing_shows_no_latency() -> None:
    """A row whose observed gateway completed no request shows "-", not 0 ms."""
    stuck = row("reserve-batch", "zookeeper", "failover")
    stuck["latency_ms"] = {"p50": None, "p99": None, "p99.9": None}
    assert "| 1,234 | - | - | - |" in table([stuck])
