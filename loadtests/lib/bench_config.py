"""The wrk benchmark's settings (``loadtests.bench``, ``loadtests.bench_workers``):
:class:`Config`, and the CLI whose every flag defaults to its ``BENCH_*``
environment variable.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtests.lib.options import RESULTS_DIR, parse_seconds, parse_settings
from loadtests.lib.pinning import Pinning, choose


@dataclass(frozen=True, slots=True)
class Config:
    """How long and how hard to drive the targets."""

    duration_s: float
    warmup_s: float
    rounds: int
    connections: int
    threads: int
    stock: int
    big_stock: int
    pinning: Pinning
    out_dir: Path
    db_settings: dict[str, str]
    # Seconds of each open-loop run (loadtests.lib.bench_openloop); 0 skips them.
    open_duration_s: float = 5.0


def build_parser(description: str | None) -> argparse.ArgumentParser:
    """The CLI (``description`` its help text); every flag defaults to its BENCH_*
    environment variable."""
    env = os.environ.get
    # BENCH_QUICK=1: a check that the bench works, not a measurement to quote.
    quick = env("BENCH_QUICK", "0") not in ("", "0")
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench", description=description)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--duration", default=env("BENCH_DURATION", "3s"))
    parser.add_argument("--warmup", default=env("BENCH_WARMUP", "1s"))
    parser.add_argument(
        "--rounds", type=int, default=int(env("BENCH_ROUNDS", "2" if quick else "5"))
    )
    parser.add_argument("--connections", type=int, default=int(env("BENCH_CONNECTIONS", "64")))
    parser.add_argument("--threads", type=int, default=int(env("BENCH_THREADS", "0")) or None)
    parser.add_argument("--stock", type=int, default=int(env("BENCH_STOCK", "10000000")))
    parser.add_argument(
        "--big-stock",
        type=int,
        default=int(env("BENCH_BIG_STOCK", "20000" if quick else "200000")),
    )
    parser.add_argument("--pin", type=int, default=int(env("BENCH_PIN", "1")))
    parser.add_argument(
        "--open-duration", default=env("BENCH_OPEN_DURATION", "2s" if quick else "5s")
    )
    parser.add_argument("--out", type=Path, default=Path(env("BENCH_OUT", str(RESULTS_DIR))))
    parser.add_argument(
        "--db-settings",
        default=env("BENCH_DB_SETTINGS", ""),
        help="PostgreSQL settings of the bench databases, e.g. plan_cache_mode=force_custom_plan",
    )
    return parser


def config_from(argv: Sequence[str] | None, description: str | None) -> Config:
    """Parse the CLI and environment into a :class:`Config`; ``description`` is the
    help text of ``--help``."""
    args = build_parser(description).parse_args(argv)
    pinning = choose(bool(args.pin))
    return Config(
        duration_s=parse_seconds(args.duration),
        warmup_s=parse_seconds(args.warmup),
        rounds=max(1, args.rounds),
        connections=args.connections,
        # One wrk thread per core it has: two threads on one core only contend.
        threads=args.threads or (1 if pinning.load is not None else 2),
        stock=args.stock,
        big_stock=args.big_stock,
        pinning=pinning,
        out_dir=args.out,
        db_settings=parse_settings(args.db_settings),
        open_duration_s=parse_seconds(args.open_duration),
    )
