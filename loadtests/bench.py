"""The wrk benchmark: the gateway against a bare aiohttp app and a naive implementation.

``python -m loadtests.bench`` (``make bench``) creates bench databases, starts
the targets on free loopback ports (``bare``: loadtests.baselines.bare, ``gateway``
and ``nometrics``: one ``flashsale-gateway serve`` process each, ``naive``:
loadtests.baselines.naive), creates their skus, sells the sold-out skus out (a small sale
of 10 units, and on the gateway a big one of ``BENCH_BIG_STOCK`` units to new
users), then drives them with wrk (``loadtests/lib/purchase.lua``) in interleaved
rounds, one target at a time (see ``loadtests.lib.bench_paths`` for the paths).

Measuring as issue 10 asks: with two cores or more wrk runs on core 0 and the
targets on core 1 (``loadtests.lib.pinning``), every (target, path) runs once per
round, rounds interleave (the order rotates each round), and the table shows
medians with min-max. The bare app has no in-stock path; its sold-out runs are
the reference for both.

It prints one table, writes ``loadtests/results/latest.json`` and
``latest.png``, records the gateway's memory idle, after the big sale and after
the load, the Redis memory of the big sale, and checks that the units sold match
the 201s wrk saw. Then the open-loop latency runs (``loadtests.lib.bench_openloop``:
fixed rates at 50 % and 80 % of each target's closed-loop median, latency from
the intended send time, HdrHistogram). Everything it started or created is removed at the end,
including on failure and Ctrl-C.

Environment (or the equivalent flags): ``BENCH_DURATION`` (3s),
``BENCH_WARMUP`` (1s), ``BENCH_ROUNDS`` (5), ``BENCH_CONNECTIONS`` (64),
``BENCH_THREADS`` (1 when pinned, else 2), ``BENCH_STOCK`` (10000000),
``BENCH_BIG_STOCK`` (200000), ``BENCH_QUICK`` (1: 2 rounds, a big sale of
20,000 and open-loop runs of 2 s, to check the bench works), ``BENCH_PIN`` (1; 0 leaves everything
unpinned), ``BENCH_OPEN_DURATION`` (5s; 0 skips the open-loop runs),
``BENCH_PG_URL``, ``BENCH_REDIS_URL``, ``BENCH_DB_SETTINGS`` (``key=value,...``
set on the bench databases); any other ``GATEWAY_*`` variable is passed to the
gateway.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from loadtests.lib import machine, wrk
from loadtests.lib.bench_checks import audit, audit_failures
from loadtests.lib.bench_config import Config, config_from
from loadtests.lib.bench_openloop import open_rows, run_open_loop
from loadtests.lib.bench_paths import (
    BIG_SKU,
    IN_STOCK_SKU,
    PATH_TARGETS,
    SMALL_SALE,
    SOLD_OUT_SKU,
    WRITERS,
)
from loadtests.lib.bench_report import flush_note, report, summarize
from loadtests.lib.bench_runs import drive
from loadtests.lib.bench_sales import sell_sales
from loadtests.lib.harness import Harness, passthrough_settings
from loadtests.lib.signals import signals_interrupt
from loadtests.lib.targets import Target
from testkit.processes import stop_process


def start_targets(harness: Harness, config: Config) -> tuple[dict[str, Target], dict[str, str]]:
    """Start bare, gateway and naive and create their skus; returns targets and databases."""
    # One database each, so neither's orders slow the other's inserts.
    databases = {name: harness.database(name) for name in WRITERS}
    targets = {
        "bare_min": harness.start_bare("bare_min", minimal=True),
        "bare": harness.start_bare(),
        "gateway": harness.start_gateway(databases["gateway"]),
        "nometrics": harness.start_gateway(
            databases["nometrics"], name="nometrics", settings={"GATEWAY_METRICS": "false"}
        ),
        "naive": harness.start_naive(databases["naive"]),
    }
    for name in WRITERS:
        # The naive app has no availability route to sell out by: it starts at 0.
        targets[name].put_sku(SOLD_OUT_SKU, 0 if name == "naive" else SMALL_SALE)
        targets[name].put_sku(IN_STOCK_SKU, config.stock)
    targets["gateway"].put_sku(BIG_SKU, config.big_stock)
    return targets, databases


def schedule(rounds: int) -> list[tuple[int, str, str]]:
    """(round, path, target) in run order: paths in turn, targets rotated per round."""
    plan = []
    for r in range(rounds):
        for path, names in PATH_TARGETS.items():
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                plan.append((r, path, name))
    return plan


def run_all(targets: dict[str, Target], config: Config, run_id: str) -> list[wrk.WrkResult]:
    """Warm every (target, path) up, then the measured runs in :func:`schedule` order."""
    runs = []
    if config.warmup_s > 0:
        for path, names in PATH_TARGETS.items():
            for name in names:
                warm = drive(targets[name], path, -1, config.warmup_s, config, f"{run_id}w")
                runs.append(warm)
                print(f"  warm-up {name:8} {path:9} {warm.rps:9.0f} req/s", flush=True)
    for round_, path, name in schedule(config.rounds):
        result = drive(targets[name], path, round_, config.duration_s, config, f"{run_id}r{round_}")
        runs.append(result)
        print(
            f"  round {round_} {name:8} {path:9} {result.rps:9.0f} req/s  "
            f"p99 {result.latency_ms['p99']:7.1f} ms  statuses {result.statuses}"
            f"{flush_note(result)}",
            flush=True,
        )
    return runs


def stop_all(targets: dict[str, Target]) -> dict[str, dict[str, Any]]:
    """Stop every target (SIGTERM), recording exit codes and how long each took."""
    stopped = {}
    for name, target in targets.items():
        began = time.monotonic()
        code = stop_process(target.process)
        stopped[name] = {"exit_code": code, "stop_s": round(time.monotonic() - began, 3)}
    return stopped


def bench(harness: Harness, config: Config) -> dict[str, Any]:
    """Run the whole benchmark inside ``harness``; returns the results document."""
    info = machine.describe()
    load_before = machine.load_average()
    print(f"bench {harness.run_id}: {info['nproc']} CPUs, {info['cpu_model']}", flush=True)
    print(f"  {config.pinning.describe()}", flush=True)
    targets, databases = start_targets(harness, config)
    memory = {name: {"idle": t.memory()} for name, t in targets.items()}
    sales = sell_sales(
        harness, targets, config.big_stock, connections=config.connections, pinning=config.pinning
    )
    runs = run_all(targets, config, harness.run_id)
    if config.open_duration_s > 0:
        runs += run_open_loop(
            targets,
            summarize(runs),
            duration_s=config.open_duration_s,
            pinning=config.pinning,
            run_id=harness.run_id,
        )
    for name, target in targets.items():
        memory[name]["end"] = target.memory()
    checks = audit(targets, databases, runs, config.stock)
    problems = {name: t.log_problems() for name, t in targets.items()}
    stopped = stop_all(targets)
    rows = summarize(runs)
    return {
        "run_id": harness.run_id,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "python -m loadtests.bench",
        "config": {k: str(v) for k, v in asdict(config).items()},
        "machine": info,
        "pinning": config.pinning.describe(),
        "sales": sales,
        "load_average": {"before": load_before, "after": machine.load_average()},
        "summary": rows,
        "open_loop": open_rows(runs),
        "runs": [r.as_json() for r in runs],
        "memory_kib": memory,
        "audit": checks,
        "log_problems": problems,
        "stopped": stopped,
        "gateway_settings": passthrough_settings(),
        "audit_failures": audit_failures(checks, runs, config.connections),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m loadtests.bench``."""
    config = config_from(argv, __doc__)
    try:
        wrk.find_wrk()
        harness = Harness(db_settings=config.db_settings, pinning=config.pinning)
        with signals_interrupt(), harness:
            results = bench(harness, config)
    except KeyboardInterrupt:
        print("bench: interrupted; everything started was stopped and removed", file=sys.stderr)
        return 130
    except (RuntimeError, OSError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    report(results, config.out_dir)
    return 1 if results["audit_failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
