"""Worker scaling: ``GATEWAY_WORKERS=2`` against 1, in one run, interleaved.

``python -m loadtests.bench_workers`` starts, each on its own database and
Redis prefix:

* ``bare_min`` (``loadtests.baselines.bare --minimal``) on the servers' core: the
  reference;
* ``w1``: one gateway process on the servers' core (core 1), wrk alone on
  core 0: the per-core figure a deployment sizes from;
* ``w2_core1``: two workers sharing that one core: what a second worker costs
  when it has no core of its own;
* ``w2_cores``: two workers left to the kernel on both cores, wrk still on
  core 0: the most two workers get on this machine, sharing a core with the
  load generator (a machine of two cores has no third for wrk).

Then it drives each with wrk like ``loadtests.bench`` (sold_out and in_stock,
``BENCH_ROUNDS`` interleaved rounds of ``BENCH_DURATION``, medians) and prints
a Markdown table with ratios to ``bare_min`` and to ``w1``. Settings are the
bench's (``BENCH_*``, see ``loadtests.bench``).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence

from loadtests.lib import machine, wrk
from loadtests.lib.bench_config import Config, config_from
from loadtests.lib.bench_paths import IN_STOCK, IN_STOCK_SKU, SMALL_SALE, SOLD_OUT, SOLD_OUT_SKU
from loadtests.lib.bench_runs import drive
from loadtests.lib.bench_sales import sell_out
from loadtests.lib.harness import Harness
from loadtests.lib.pinning import Pinning
from loadtests.lib.signals import signals_interrupt
from loadtests.lib.targets import Target

GATEWAYS = {"w1": ("1", True), "w2_core1": ("2", True), "w2_cores": ("2", False)}
PATHS = {SOLD_OUT: ("bare_min", *GATEWAYS), IN_STOCK: tuple(GATEWAYS)}


def start(harness: Harness, config: Config) -> dict[str, Target]:
    """The reference and the three gateways, skus created and the small sale sold."""
    targets = {"bare_min": harness.start_bare("bare_min", minimal=True)}
    pinned = harness.pinning
    for name, (workers, on_server_core) in GATEWAYS.items():
        # The one target left to the kernel gets no taskset; the rest stay pinned.
        harness.pinning = pinned if on_server_core else Pinning(pinned.load, None)
        try:
            gateway = harness.start_gateway(
                harness.database(name), name=name, settings={"GATEWAY_WORKERS": workers}
            )
        finally:
            harness.pinning = pinned
        targets[name] = gateway
        gateway.put_sku(SOLD_OUT_SKU, SMALL_SALE)
        gateway.put_sku(IN_STOCK_SKU, config.stock)
        sell_out(
            gateway,
            SOLD_OUT_SKU,
            SMALL_SALE,
            connections=config.connections,
            pinning=config.pinning,
            tag=f"{harness.run_id}{name}",
        )
    return targets


def run(targets: dict[str, Target], config: Config, run_id: str) -> list[wrk.WrkResult]:
    """Warm-ups, then interleaved rounds (the order rotates each round)."""
    runs = []
    for path, names in PATHS.items():
        for name in names:
            drive(targets[name], path, -1, config.warmup_s, config, f"{run_id}w")
    for round_ in range(config.rounds):
        for path, names in PATHS.items():
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                before = targets[name].scrape() if path == IN_STOCK else {}
                result = drive(
                    targets[name], path, round_, config.duration_s, config, f"{run_id}r{round_}"
                )
                if path == IN_STOCK:
                    result.extra.update(flushes(before, targets[name].scrape()))
                runs.append(result)
                print(f"  round {round_} {name:9} {path:9} {result.rps:8.0f} req/s", flush=True)
    return runs


def flushes(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the gateway's own counters say of the flushes between two scrapes:
    its mean batch and the flush lock's acquisitions per flush (with several
    workers, all of them: their /metrics adds up)."""
    count = after.get("flashsale_batch_size_count", 0.0) - before.get(
        "flashsale_batch_size_count", 0.0
    )
    if count <= 0:
        return {}
    size = after["flashsale_batch_size_sum"] - before.get("flashsale_batch_size_sum", 0.0)
    taken = after.get("flashsale_lock_acquisitions_total", 0.0) - before.get(
        "flashsale_lock_acquisitions_total", 0.0
    )
    return {"mean_batch": size / count, "acquisitions_per_flush": taken / count}


def table(runs: Sequence[wrk.WrkResult]) -> str:
    """Medians per (target, path), with ratios to bare_min and to one worker."""
    median = {
        (name, path): statistics.median(r.rps for r in runs if (r.target, r.path) == (name, path))
        for path, names in PATHS.items()
        for name in names
    }
    p99 = {
        (name, path): statistics.median(
            r.latency_ms["p99"] for r in runs if (r.target, r.path) == (name, path)
        )
        for path, names in PATHS.items()
        for name in names
    }
    reference = median[("bare_min", SOLD_OUT)]
    lines = [
        "| target | path | requests/s median | p99 ms | to bare_min | to w1 | CPU µs/request"
        " | mean batch | lock acquisitions a flush |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for (name, path), rps in median.items():
        one = median.get(("w1", path))
        to_one = f"{rps / one:.2f}" if one and name != "bare_min" else "-"
        cpu = [
            r.extra["cpu_us_per_request"]
            for r in runs
            if (r.target, r.path) == (name, path) and "cpu_us_per_request" in r.extra
        ]
        counted = [r.extra for r in runs if (r.target, r.path) == (name, path)]
        batch = [c["mean_batch"] for c in counted if "mean_batch" in c]
        taken = [c["acquisitions_per_flush"] for c in counted if "acquisitions_per_flush" in c]
        lines.append(
            f"| {name} | {path} | {rps:,.0f} | {p99[(name, path)]:.1f} | "
            f"{rps / reference:.2f} | {to_one} | "
            f"{statistics.median(cpu) if cpu else 0:.0f} | "
            f"{f'{statistics.median(batch):.1f}' if batch else '-'} | "
            f"{f'{statistics.median(taken):.2f}' if taken else '-'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m loadtests.bench_workers``."""
    config = config_from(argv, __doc__)
    try:
        wrk.find_wrk()
        harness = Harness(db_settings=config.db_settings, pinning=config.pinning)
        with signals_interrupt(), harness:
            print(f"workers bench {harness.run_id}: {config.pinning.describe()}", flush=True)
            load_before = machine.load_average()
            targets = start(harness, config)
            runs = run(targets, config, harness.run_id)
            load_after = machine.load_average()
    except KeyboardInterrupt:
        print("workers bench: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, OSError) as exc:
        print(f"workers bench: {exc}", file=sys.stderr)
        return 1
    print()
    print(table(runs))
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load_before}")
    print(f"after: {load_after}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
