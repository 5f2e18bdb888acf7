"""Locust against a private gateway: ``python -m loadtests.locust_run`` (``make locust``).

Starts one gateway on a fresh bench database and Redis prefix (the same
start-up as the wrk bench, :mod:`loadtests.targets`), runs a Locust profile
headless against it (the flash crowd for 30 s by default) in a subprocess, and
writes the CSV stats and the HTML report to ``loadtests/results/``
(``locust_<profile>_stats.csv``..., ``locust_<profile>.html``). Everything is
removed at the end, including on failure and Ctrl-C. Exits non-zero when a
request failed (5xx, unexpected status, or a broken sale rule).

Environment (or flags): ``LOCUST_PROFILE`` (flash_crowd, or ``all``),
``LOCUST_DURATION`` (30s), ``LOCUST_USERS`` and ``LOCUST_SPAWN_RATE`` (the
profile's), plus the locustfile's ``LOCUST_*`` stock settings.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loadtests.profiles import PROFILES, Profile
from loadtests.targets import REPO_ROOT, RESULTS_DIR, Harness, parse_seconds, signals_interrupt

LOCUSTFILE = REPO_ROOT / "loadtests" / "locustfile.py"
# Locust's own start-up and shutdown on top of the run time.
OVERHEAD_S = 60.0


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


@dataclass(frozen=True, slots=True)
class LocustRun:
    """A finished Locust subprocess and its stats."""

    returncode: int
    stdout: str
    stderr: str
    stats: LocustStats

    @property
    def output(self) -> str:
        """Both streams, for error messages: the summary tables, then the log."""
        return f"{self.stdout}\n{self.stderr}"


def locust_command(
    profile: Profile,
    host: str,
    *,
    duration_s: float,
    users: int,
    spawn_rate: float,
    csv_prefix: Path,
    html: Path | None = None,
) -> list[str]:
    """The ``python -m locust`` command line of a headless run of ``profile``."""
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--host",
        host,
        "--users",
        str(users),
        "--spawn-rate",
        f"{spawn_rate:g}",
        "--run-time",
        f"{duration_s:g}s",
        "--csv",
        str(csv_prefix),
        # Written at exit from the final stats; the CSV files are rewritten
        # once a second and may miss the last second's requests.
        "--json-file",
        str(csv_prefix),  # Locust adds ".json"
        "--only-summary",
        "--loglevel",
        "WARNING",
    ]
    if html is not None:
        cmd += ["--html", str(html)]
    return [*cmd, *profile.user_classes]


def run_locust(
    profile: Profile,
    host: str,
    admin_token: str | None,
    *,
    duration_s: float,
    csv_prefix: Path,
    users: int | None = None,
    spawn_rate: float | None = None,
    html: Path | None = None,
    extra_env: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> LocustRun:
    """Run ``profile`` headless in a subprocess (gevent stays out of this process).

    Raises :class:`subprocess.TimeoutExpired` (after killing Locust) when it
    runs past ``timeout_s``, by default the duration plus a minute.
    """
    cmd = locust_command(
        profile,
        host,
        duration_s=duration_s,
        users=users or profile.users,
        spawn_rate=spawn_rate or profile.spawn_rate,
        csv_prefix=csv_prefix,
        html=html,
    )
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_ADMIN_TOKEN"}
    if admin_token is not None:
        env["GATEWAY_ADMIN_TOKEN"] = admin_token
    env.update(extra_env or {})
    csv_prefix.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        cmd,
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=duration_s + OVERHEAD_S if timeout_s is None else timeout_s,
        check=False,
    )
    return LocustRun(done.returncode, done.stdout, done.stderr, read_stats(csv_prefix))


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


def build_parser() -> argparse.ArgumentParser:
    """The CLI; flags default to LOCUST_* environment variables."""
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="python -m loadtests.locust_run", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--profile", default=env("LOCUST_PROFILE", "flash_crowd"), choices=[*PROFILES, "all"]
    )
    parser.add_argument("--duration", default=env("LOCUST_DURATION", "30s"))
    parser.add_argument("--users", type=int, default=int(env("LOCUST_USERS", "0")) or None)
    parser.add_argument(
        "--spawn-rate", type=float, default=float(env("LOCUST_SPAWN_RATE", "0")) or None
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m loadtests.locust_run``."""
    args = build_parser().parse_args(argv)
    duration_s = parse_seconds(args.duration)
    names = list(PROFILES) if args.profile == "all" else [args.profile]
    failed = False
    try:
        with signals_interrupt(), Harness() as harness:
            gateway = harness.start_gateway(harness.database("locust"))
            print(f"gateway on {gateway.url} (pid {gateway.pid})", flush=True)
            for name in names:
                run = run_locust(
                    PROFILES[name],
                    gateway.url,
                    gateway.admin_token,
                    duration_s=duration_s,
                    users=args.users,
                    spawn_rate=args.spawn_rate,
                    csv_prefix=args.out / f"locust_{name}",
                    html=args.out / f"locust_{name}.html",
                )
                if run.stderr.strip():
                    print("\n".join(run.stderr.strip().splitlines()[-20:]), file=sys.stderr)
                print(summary_line(name, run.stats))
                print(format_stats(run.stats), flush=True)
                failed = failed or run.returncode != 0 or run.stats.failures > 0
            print(f"gateway memory (KiB): {gateway.memory()}")
            print(f"gateway warnings/errors: {gateway.log_problems() or 'none'}")
    except KeyboardInterrupt:
        print("locust_run: interrupted; everything started was removed", file=sys.stderr)
        return 130
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"locust_run: {exc}", file=sys.stderr)
        return 1
    print(f"CSV and HTML reports in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
