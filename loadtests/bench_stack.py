"""The whole stack on one core: what a durable order costs each process, relay on and off.

``python -m loadtests.bench_stack`` (the second half of ``make bench``) is the
operator's benchmark of issue 42: the gateway, every PostgreSQL process and
Redis on core 1, wrk (``-t1 -c64``) on core 0. PostgreSQL and Redis are the
bench's own (``loadtests.lib.stack_servers``: the shared servers are not
moved), PostgreSQL with fsync and synchronous_commit on.

Rounds alternate a fresh gateway with its events relayed to the stream (the
default, ``relay_on``) and one with ``GATEWAY_EVENTS_RELAY=false``
(``relay_off``: the outbox's triggers still write each order's event, nobody
delivers it), each on a fresh database, in stock: a sku of 50,000,000 units,
``per_user_limit`` 1, a new buyer on every request (``loadtests.lib.stack_round``).
Each round: a warm-up, the warm-up's events delivered, then the load's seconds
and the relay's catch-up, over which the CPU time of each process
(``/proc``; ``loadtests.lib.proc_cpu``) is divided by the orders made. The
bare aiohttp handler (``loadtests.baselines.bare --minimal``, answering
sold out) runs on the same core before and after each round: the reference
of the ratios, round by round. Each event's delivery lag is read from the
stream once the window is closed (``loadtests.lib.stream_lag``: its entry id,
Redis's clock at the append, less its ``occurred_at``), so no reader costs
the stack anything while it is measured.

Output: a table per mode (req/s, p99, µs of CPU per order of the gateway,
PostgreSQL and Redis, their total and ratios to the bare handler, the
lag), the CPU per order of each process, Redis's time per command, and
``loadtests/results/stack.json``.

Environment (or flags): ``BENCH_QUICK=1`` (2 rounds of 3 s each mode),
``BENCH_STACK_ROUNDS`` (6 each mode), ``BENCH_STACK_SECONDS`` (8s),
``BENCH_STACK_CATCHUP`` (1.5s), ``BENCH_STACK_WARMUP`` (1s), ``BENCH_STACK_IDLE``
(0s; ``--idle 8s``: each round first measures the stack with no load, what
a gateway costs between sales, its relay's polls included),
``BENCH_STACK_BARE`` (3s, each bare run), ``BENCH_STACK_STOCK`` (50000000),
``BENCH_CONNECTIONS`` (64), ``BENCH_OUT``; ``--pg-stat-statements`` loads that
extension (for a profile: it costs each statement a little), ``--profile DIR``
samples the gateway with py-spy and the stack's core with perf in each window
(``loadtests.lib.stack_profile``), ``--mode NAME=GATEWAY_X=value,...`` adds a
mode alternating with the two (a lever that is a setting, measured in the same
run, its events' cost paired with the same round's relay off). Any other
``GATEWAY_*`` variable is passed to both gateways.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtests.lib import machine, stack_profile, wrk
from loadtests.lib.bench_paths import SOLD_OUT
from loadtests.lib.bench_runs import measured
from loadtests.lib.harness import Harness, passthrough_settings
from loadtests.lib.options import RESULTS_DIR, parse_seconds
from loadtests.lib.pinning import Pinning, choose
from loadtests.lib.signals import signals_interrupt
from loadtests.lib.stack_report import report
from loadtests.lib.stack_round import RoundPlan, RoundResult, run_round
from loadtests.lib.stack_servers import Stack, private_stack
from loadtests.lib.targets import Target

MODES = {"relay_on": {}, "relay_off": {"GATEWAY_EVENTS_RELAY": "false"}}
RELAY_OFF = MODES["relay_off"]


def parse_mode(raw: str) -> tuple[str, dict[str, str]]:
    """``NAME=GATEWAY_X=1,GATEWAY_Y=2``: a further mode and its gateway's settings."""
    name, _, rest = raw.partition("=")
    settings = dict(item.split("=", 1) for item in rest.split(",") if "=" in item)
    if not name.isidentifier() or not all(k.startswith("GATEWAY_") for k in settings):
        raise argparse.ArgumentTypeError(f"not NAME=GATEWAY_X=value,...: {raw!r}")
    return name, settings


@dataclass(frozen=True, slots=True)
class StackConfig:
    """How long and how hard to drive the stack."""

    rounds: int
    load_s: float
    catchup_s: float
    warmup_s: float
    bare_s: float
    stock: int
    connections: int
    statements: bool
    out_dir: Path
    profile_dir: Path | None = None
    idle_s: float = 0.0
    modes: tuple[tuple[str, dict[str, str]], ...] = tuple(MODES.items())


def config_from(argv: Sequence[str] | None) -> StackConfig:
    """The CLI, every flag defaulting to its ``BENCH_*`` variable (``BENCH_QUICK``: short)."""
    env = os.environ.get
    quick = env("BENCH_QUICK", "0") not in ("", "0")
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench_stack", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--rounds", type=int, default=int(env("BENCH_STACK_ROUNDS", "2" if quick else "6"))
    )
    parser.add_argument("--seconds", default=env("BENCH_STACK_SECONDS", "3s" if quick else "8s"))
    parser.add_argument("--catchup", default=env("BENCH_STACK_CATCHUP", "1.5s"))
    parser.add_argument("--warmup", default=env("BENCH_STACK_WARMUP", "1s"))
    parser.add_argument(
        "--idle",
        default=env("BENCH_STACK_IDLE", "0s"),
        help="each round also measures the stack this long with no load (0s: not at all)",
    )
    parser.add_argument("--bare", default=env("BENCH_STACK_BARE", "2s" if quick else "3s"))
    parser.add_argument("--stock", type=int, default=int(env("BENCH_STACK_STOCK", "50000000")))
    parser.add_argument("--connections", type=int, default=int(env("BENCH_CONNECTIONS", "64")))
    parser.add_argument("--pg-stat-statements", action="store_true")
    parser.add_argument(
        "--mode",
        type=parse_mode,
        action="append",
        default=[],
        help="a further mode alternating with the two: NAME=GATEWAY_X=value,... (a lever "
        "that is a setting, measured in the same run)",
    )
    parser.add_argument("--profile", type=Path, default=None, help="py-spy and perf into DIR")
    parser.add_argument("--out", type=Path, default=Path(env("BENCH_OUT", str(RESULTS_DIR))))
    args = parser.parse_args(argv)
    return StackConfig(
        rounds=max(1, args.rounds),
        load_s=parse_seconds(args.seconds),
        catchup_s=parse_seconds(args.catchup),
        warmup_s=parse_seconds(args.warmup),
        bare_s=parse_seconds(args.bare),
        stock=args.stock,
        connections=args.connections,
        statements=args.pg_stat_statements,
        out_dir=args.out,
        profile_dir=args.profile,
        idle_s=parse_seconds(args.idle),
        modes=(*MODES.items(), *args.mode),
    )


def schedule(rounds: int, names: Sequence[str] = tuple(MODES)) -> list[tuple[int, str]]:
    """(round, mode) in run order: the modes alternate, their order flips each round."""
    names = list(names)
    return [(r, mode) for r in range(rounds) for mode in (names if r % 2 == 0 else names[::-1])]


def bare_run(bare: Target, config: StackConfig, pinning: Pinning, tag: str) -> wrk.WrkResult:
    """One run of the bare handler (sold out) on the stack's core."""
    result = measured(
        bare,
        SOLD_OUT,
        0,
        config.bare_s,
        tag=tag,
        connections=config.connections,
        threads=1,
        pinning=pinning,
    )
    print(
        f"  bare_min  {result.rps:9,.0f} req/s  p99 {result.latency_ms['p99']:6.1f} ms  "
        f"{result.extra.get('cpu_us_per_request', 0):5.1f} µs/request",
        flush=True,
    )
    return result


def plan_of(mode: str, round_: int, config: StackConfig) -> RoundPlan:
    """The round's plan: the mode's settings, the config's times."""
    return RoundPlan(
        mode=mode,
        round=round_,
        settings=dict(config.modes)[mode],
        stock=config.stock,
        warmup_s=config.warmup_s,
        load_s=config.load_s,
        catchup_s=config.catchup_s,
        connections=config.connections,
        relayed=dict(config.modes)[mode] != RELAY_OFF,
        statements=config.statements,
        profile_dir=config.profile_dir,
        idle_s=config.idle_s,
    )


def progress(result: RoundResult) -> str:
    """One line per round."""
    w = result.wrk
    lag = result.lag_ms
    lag_note = f"  lag p50 {lag['p50']:.0f} p99 {lag['p99']:.0f} ms" if lag.get("count") else ""
    if result.problems:
        lag_note += f"  logged {result.problems}"
    return (
        f"  round {result.round} {result.mode:9} {w.rps:8,.0f} req/s  p99 "
        f"{w.latency_ms['p99']:5.1f} ms  {result.orders:7,} orders  µs/order: gateway "
        f"{result.per_order_us('gateway'):5.1f} postgres {result.per_order_us('postgres'):5.1f} "
        f"redis {result.per_order_us('redis'):5.1f}  flush batch {result.mean_batch:.0f}  "
        f"owed after {result.owed_after}{lag_note}"
    )


def bench(stack: Stack, config: StackConfig, pinning: Pinning) -> dict[str, Any]:
    """Every round and bare run in order; returns the results document."""
    load_before = machine.load_average()
    harness = Harness(pg_url=stack.pg_url, redis_url=stack.redis_url, pinning=pinning)
    bares: list[wrk.WrkResult] = []
    rounds: list[RoundResult] = []
    with harness:
        bare = harness.start_bare("bare_min", minimal=True)
        bare_run(bare, config, pinning, f"{harness.run_id}bw")  # warm-up, not kept
        bares.append(bare_run(bare, config, pinning, f"{harness.run_id}b0"))
        for i, (round_, mode) in enumerate(
            schedule(config.rounds, [name for name, _ in config.modes])
        ):
            result = run_round(harness, stack, plan_of(mode, round_, config), pinning)
            rounds.append(result)
            print(progress(result), flush=True)
            bares.append(bare_run(bare, config, pinning, f"{harness.run_id}b{i + 1}"))
    return {
        "run_id": harness.run_id,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "python -m loadtests.bench_stack",
        "config": {k: str(v) for k, v in asdict(config).items()},
        "machine": machine.describe(),
        "pinning": f"stack (gateway, PostgreSQL, Redis) on core {pinning.servers}, "
        f"wrk -t1 -c{config.connections} on core {pinning.load}",
        "load_average": {"before": load_before, "after": machine.load_average()},
        "bare": [b.as_json() for b in bares],
        "rounds": [r.as_json() for r in rounds],
        "gateway_settings": passthrough_settings(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m loadtests.bench_stack``."""
    config = config_from(argv)
    pinning = choose()
    if pinning.load is None:
        print("bench_stack: needs two cores and taskset; running unpinned", file=sys.stderr)
    print(
        f"stack bench: {config.rounds} rounds each of relay on/off, {config.load_s:g} s of load "
        f"+ {config.catchup_s:g} s catch-up; gateway, PostgreSQL and Redis on core "
        f"{pinning.servers}, wrk on core {pinning.load}",
        flush=True,
    )
    try:
        wrk.find_wrk()
        with signals_interrupt(), private_stack(pinning.servers, statements=config.statements) as s:
            results = bench(s, config, pinning)
    except KeyboardInterrupt:
        print(
            "bench_stack: interrupted; everything started was stopped and removed", file=sys.stderr
        )
        return 130
    except (RuntimeError, OSError) as exc:
        print(f"bench_stack: {exc}", file=sys.stderr)
        return 1
    status = report(results, config.out_dir)
    if config.profile_dir is not None:
        print(stack_profile.report(config.profile_dir, results["rounds"]))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
