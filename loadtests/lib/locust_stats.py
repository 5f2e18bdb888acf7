"""What a Locust run's CSV and JSON files say: counts, latency and failure rows."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Failure:
    """One row of Locust's failures CSV."""

    method: str
    name: str
    error: str
    occurrences: int


@dataclass(frozen=True, slots=True)
class LocustStats:
    """What a run's CSV files say."""

    requests: int
    failures: int
    rps: float
    p50_ms: float
    p99_ms: float
    by_name: dict[str, tuple[int, int]] = field(default_factory=dict)
    failure_rows: tuple[Failure, ...] = ()
    # (p50, p99) in ms by request name, from the CSV (up to a second stale).
    latency_ms: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def server_errors(self) -> int:
        """Failures that were 5xx responses (see the locustfile's ``judge``)."""
        return sum(f.occurrences for f in self.failure_rows if "server error" in f.error)


def _number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:  # "N/A" when nothing was recorded
        return 0.0


def _final_counts(json_path: Path) -> dict[str, tuple[int, int]] | None:
    """(requests, failures) by name from ``--json-file``, or None without one."""
    try:
        entries = json.loads(json_path.read_text())
    except (OSError, ValueError):
        return None
    counts: dict[str, tuple[int, int]] = {}
    for e in entries:
        requests, failures = counts.get(e["name"], (0, 0))
        counts[e["name"]] = (requests + e["num_requests"], failures + e["num_failures"])
    return counts


def read_stats(csv_prefix: Path) -> LocustStats:
    """Parse ``<prefix>_stats.csv`` and ``<prefix>_failures.csv``.

    Request and failure counts come from ``<prefix>.json`` when Locust wrote
    it, since it holds the final numbers and the CSV files may lag a second.
    """
    stats_path = Path(f"{csv_prefix}_stats.csv")
    failures_path = Path(f"{csv_prefix}_failures.csv")
    by_name: dict[str, tuple[int, int]] = {}
    latency: dict[str, tuple[float, float]] = {}
    total = {"Request Count": "0", "Failure Count": "0", "Requests/s": "0", "50%": "0"}
    if stats_path.exists():
        with stats_path.open(newline="") as f:
            for row in csv.DictReader(f):
                if row["Name"] == "Aggregated":
                    total = row
                else:
                    by_name[row["Name"]] = (int(row["Request Count"]), int(row["Failure Count"]))
                    latency[row["Name"]] = (_number(row["50%"]), _number(row.get("99%", "0")))
    final = _final_counts(Path(f"{csv_prefix}.json"))
    if final is not None:
        by_name = final
        total = {
            **total,
            "Request Count": str(sum(r for r, _ in final.values())),
            "Failure Count": str(sum(f for _, f in final.values())),
        }
    failures: list[Failure] = []
    if failures_path.exists():
        with failures_path.open(newline="") as f:
            failures = [
                Failure(r["Method"], r["Name"], r["Error"], int(r["Occurrences"]))
                for r in csv.DictReader(f)
            ]
    return LocustStats(
        requests=int(total["Request Count"]),
        failures=int(total["Failure Count"]),
        rps=_number(total["Requests/s"]),
        p50_ms=_number(total["50%"]),
        p99_ms=_number(total.get("99%", "0")),
        by_name=by_name,
        failure_rows=tuple(failures),
        latency_ms=latency,
    )


def summary_line(name: str, stats: LocustStats) -> str:
    """One line per profile for the terminal."""
    return (
        f"{name}: {stats.requests} requests, {stats.failures} failures "
        f"({stats.server_errors} 5xx), {stats.rps:.0f} req/s, "
        f"p50 {stats.p50_ms:.0f} ms, p99 {stats.p99_ms:.0f} ms"
    )


def format_stats(stats: LocustStats) -> str:
    """Requests, failures and latency by request name, then the failure messages.

    Locust prints no summary of its own when it writes ``--json-file``.
    """
    lines = [f"  {'request':40} {'count':>8} {'fails':>6} {'p50 ms':>7} {'p99 ms':>7}"]
    for name, (count, fails) in sorted(stats.by_name.items()):
        p50, p99 = stats.latency_ms.get(name, (0.0, 0.0))
        lines.append(f"  {name:40} {count:8} {fails:6} {p50:7.0f} {p99:7.0f}")
    lines += [f"  failure: {f.occurrences} x {f.name}: {f.error}" for f in stats.failure_rows]
    return "\n".join(lines)
