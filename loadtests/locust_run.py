"""Locust against a private gateway: ``python -m loadtests.locust_run`` (``make locust``).

Starts one gateway on a fresh bench database and Redis prefix (the same
start-up as the wrk bench, :mod:`loadtests.lib.harness`), runs a Locust profile
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
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtests.lib.harness import Harness
from loadtests.lib.locust_stats import LocustStats, format_stats, read_stats, summary_line
from loadtests.lib.options import REPO_ROOT, RESULTS_DIR, parse_seconds
from loadtests.lib.profiles import PROFILES, Profile
from loadtests.lib.signals import signals_interrupt

LOCUSTFILE = REPO_ROOT / "loadtests" / "lib" / "locustfile.py"
# Locust's own start-up and shutdown on top of the run time.
OVERHEAD_S = 60.0


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
