"""The wrk benchmark: the gateway against a bare aiohttp app and a naive implementation.

``python -m loadtests.bench`` (``make bench``) creates bench databases, starts
three targets on free loopback ports (``bare``: loadtests.baseline, ``gateway``:
one ``flashsale-gateway serve`` process, ``naive``: loadtests.naive), creates
their skus, and drives them one at a time, alternating, with wrk
(``loadtests/purchase.lua``):

* ``sold_out``: every request for a sku with stock 0 (409 expected);
* ``in_stock``: every request a new user on a sku with 10 million units (201
  expected). The bare app has no in-stock path; its sold-out run of the same
  round is the reference for both paths.

It prints one table, writes ``loadtests/results/latest.json`` and
``latest.png``, records the gateway's memory idle and after the load, and checks
that the units sold match the 201s wrk saw. Everything it started or created
is removed at the end, including on failure and Ctrl-C.

Environment (or the equivalent flags): ``BENCH_DURATION`` (10s),
``BENCH_WARMUP`` (2s), ``BENCH_ROUNDS`` (1), ``BENCH_CONNECTIONS`` (64),
``BENCH_THREADS`` (2), ``BENCH_STOCK`` (10000000), ``BENCH_PG_URL``,
``BENCH_REDIS_URL``, ``BENCH_DB_SETTINGS`` (``key=value,...`` set on the bench
databases); any other ``GATEWAY_*`` variable is passed to the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import asyncpg

from loadtests import machine, wrk
from loadtests.targets import (
    RESULTS_DIR,
    Harness,
    Target,
    http,
    parse_seconds,
    parse_settings,
    passthrough_settings,
    signals_interrupt,
    stop_process,
)

SOLD_OUT, IN_STOCK = "sold_out", "in_stock"
SOLD_OUT_SKU, IN_STOCK_SKU = "bench-soldout", "bench-instock"
# "nometrics" is the gateway with GATEWAY_METRICS=false: what the metrics cost.
TARGETS = ("bare", "gateway", "nometrics", "naive")
PATH_TARGETS = {
    SOLD_OUT: ("bare", "gateway", "nometrics", "naive"),
    IN_STOCK: ("gateway", "nometrics", "naive"),
}
WRITERS = ("gateway", "nometrics", "naive")
SKU_OF = {SOLD_OUT: SOLD_OUT_SKU, IN_STOCK: IN_STOCK_SKU}
SETTLE_TIMEOUT_S = 15.0
SOLD_SNAPSHOT = """
SELECT stock, (SELECT count(*) FROM orders WHERE sku = $1) AS orders
FROM inventory WHERE sku = $1
"""


@dataclass(frozen=True, slots=True)
class Config:
    """How long and how hard to drive the targets."""

    duration_s: float
    warmup_s: float
    rounds: int
    connections: int
    threads: int
    stock: int
    out_dir: Path
    db_settings: dict[str, str]


def build_parser() -> argparse.ArgumentParser:
    """The CLI; every flag defaults to its BENCH_* environment variable."""
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--duration", default=env("BENCH_DURATION", "10s"))
    parser.add_argument("--warmup", default=env("BENCH_WARMUP", "2s"))
    parser.add_argument("--rounds", type=int, default=int(env("BENCH_ROUNDS", "1")))
    parser.add_argument("--connections", type=int, default=int(env("BENCH_CONNECTIONS", "64")))
    parser.add_argument("--threads", type=int, default=int(env("BENCH_THREADS", "2")))
    parser.add_argument("--stock", type=int, default=int(env("BENCH_STOCK", "10000000")))
    parser.add_argument("--out", type=Path, default=Path(env("BENCH_OUT", str(RESULTS_DIR))))
    parser.add_argument(
        "--db-settings",
        default=env("BENCH_DB_SETTINGS", ""),
        help="PostgreSQL settings of the bench databases, e.g. plan_cache_mode=force_custom_plan",
    )
    return parser


def config_from(argv: Sequence[str] | None) -> Config:
    """Parse the CLI and environment into a :class:`Config`."""
    args = build_parser().parse_args(argv)
    return Config(
        duration_s=parse_seconds(args.duration),
        warmup_s=parse_seconds(args.warmup),
        rounds=max(1, args.rounds),
        connections=args.connections,
        threads=args.threads,
        stock=args.stock,
        out_dir=args.out,
        db_settings=parse_settings(args.db_settings),
    )


def start_targets(harness: Harness, config: Config) -> tuple[dict[str, Target], dict[str, str]]:
    """Start bare, gateway and naive and create their skus; returns targets and databases."""
    # One database each, so neither's orders slow the other's inserts.
    databases = {name: harness.database(name) for name in WRITERS}
    targets = {
        "bare": harness.start_bare(),
        "gateway": harness.start_gateway(databases["gateway"]),
        "nometrics": harness.start_gateway(
            databases["nometrics"], name="nometrics", settings={"GATEWAY_METRICS": "false"}
        ),
        "naive": harness.start_naive(databases["naive"]),
    }
    for name in WRITERS:
        targets[name].put_sku(SOLD_OUT_SKU, 0)
        targets[name].put_sku(IN_STOCK_SKU, config.stock)
    return targets, databases


def drive(
    target: Target, path: str, round_: int, seconds: float, config: Config, tag: str
) -> wrk.WrkResult:
    """One wrk run of ``path`` against ``target``; fails if the target died."""
    started = time.time()
    before = target.scrape()
    raw = wrk.run(
        target.url,
        sku=SKU_OF[path],
        tag=tag,
        duration_s=seconds,
        connections=config.connections,
        threads=config.threads,
    )
    if target.process.poll() is not None:
        raise RuntimeError(f"{target.name} died under load:\n{target.log_tail()}")
    result = wrk.to_result(target.name, path, round_, raw, started)
    if before:
        result.extra["metrics"] = metrics_delta(before, target.scrape())
    return result


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the gateway's counters and histograms did during one run.

    Adds mean batch size, mean flush time and mean lock wait when the gateway
    exports those histograms; only what changed is kept.
    """
    delta = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
    for name, key, scale in (
        ("flashsale_batch_size", "mean_batch_size", 1.0),
        ("flashsale_flush_duration_seconds", "mean_flush_ms", 1000.0),
        ("flashsale_lock_wait_seconds", "mean_lock_wait_ms", 1000.0),
    ):
        count = delta.get(f"{name}_count", 0.0)
        if count:
            delta[key] = round(scale * delta.get(f"{name}_sum", 0.0) / count, 3)
    return delta


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
            f"{_flush_note(result)}",
            flush=True,
        )
    return runs


def _flush_note(result: wrk.WrkResult) -> str:
    metrics = result.extra.get("metrics", {})
    if "mean_batch_size" not in metrics:
        return ""
    return (
        f"  batches {metrics['flashsale_batch_size_count']:.0f} "
        f"of {metrics['mean_batch_size']:.1f}, flush {metrics.get('mean_flush_ms', 0):.1f} ms"
    )


def summarize(runs: Sequence[wrk.WrkResult]) -> list[dict[str, Any]]:
    """One row per (target, path): medians over rounds, errors and statuses summed."""
    measured = [r for r in runs if r.round >= 0]
    bare = [r.rps for r in measured if r.target == "bare"]
    bare_rps = statistics.median(bare) if bare else 0.0
    rows = []
    for path, names in PATH_TARGETS.items():
        for name in names:
            mine = [r for r in measured if r.target == name and r.path == path]
            if not mine:
                continue
            statuses: Counter[str] = Counter()
            for r in mine:
                statuses.update(r.statuses)
            rps = statistics.median(r.rps for r in mine)
            rows.append(
                {
                    "target": name,
                    "path": path,
                    "rounds": len(mine),
                    "rps": rps,
                    "p50_ms": statistics.median(r.latency_ms["p50"] for r in mine),
                    "p99_ms": statistics.median(r.latency_ms["p99"] for r in mine),
                    "errors": sum(r.errors for r in mine),
                    "ratio_to_bare": rps / bare_rps if bare_rps else None,
                    "statuses": dict(sorted(statuses.items())),
                }
            )
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The summary as a Markdown table (readable in a terminal too)."""
    lines = [
        "| target | path | requests/s | p50 ms | p99 ms | errors | ratio to bare | statuses |",
        "|---|---|--:|--:|--:|--:|--:|---|",
    ]
    for row in rows:
        ratio = row["ratio_to_bare"]
        statuses = " ".join(f"{k}:{v}" for k, v in row["statuses"].items())
        lines.append(
            f"| {row['target']} | {row['path']} | {row['rps']:,.0f} | {row['p50_ms']:.2f} | "
            f"{row['p99_ms']:.2f} | {row['errors']} | "
            f"{'-' if ratio is None else f'{ratio:.2f}'} | {statuses} |"
        )
    return "\n".join(lines)


async def _fetch_sold(database_url: str, sku: str) -> dict[str, int]:
    con = await asyncpg.connect(database_url)
    try:
        # One statement, one snapshot: a flush committing between two reads
        # would make stock and orders disagree by its size.
        row = await con.fetchrow(SOLD_SNAPSHOT, sku)
    finally:
        await con.close()
    if row is None:
        raise RuntimeError(f"sku {sku!r} vanished from {database_url}")
    return {"db_stock": int(row["stock"]), "orders": int(row["orders"])}


def wait_settled(gateway: Target, deadline_s: float = SETTLE_TIMEOUT_S) -> dict[str, Any]:
    """Poll the gateway's admin report until nothing is pending (or the deadline)."""
    deadline = time.monotonic() + deadline_s
    report: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status, body = http(
            "GET", f"{gateway.url}/admin/skus/{IN_STOCK_SKU}", token=gateway.admin_token
        )
        report = body if status == 200 and isinstance(body, dict) else {"status": status}
        if report.get("pending") == 0:
            break
        time.sleep(0.1)
    return report


def audit(
    targets: dict[str, Target], databases: dict[str, str], runs: Sequence[wrk.WrkResult], stock: int
) -> dict[str, Any]:
    """Units sold against the 201s wrk counted, and stock conservation, per target.

    wrk stops with requests in flight, so up to ``connections`` orders per run
    may commit unseen; more than that, or fewer orders than 201s, is a bug.
    """
    found: dict[str, Any] = {}
    for name in WRITERS:
        seen = sum(r.statuses.get("201", 0) for r in runs if r.target == name)
        sold = asyncio.run(_fetch_sold(databases[name], IN_STOCK_SKU))
        entry: dict[str, Any] = {
            "confirmed_seen_by_wrk": seen,
            **sold,
            "unseen_orders": sold["orders"] - seen,
            "stock_conserved": sold["db_stock"] + sold["orders"] == stock,
        }
        if name != "naive":
            entry["admin_report"] = wait_settled(targets[name])
        found[name] = entry
    return found


def audit_failures(
    checks: dict[str, Any], runs: Sequence[wrk.WrkResult], connections: int
) -> list[str]:
    """What the audit found wrong: a benchmark that oversells must not pass quietly."""
    found = []
    for name, entry in checks.items():
        mine = [r for r in runs if r.target == name and r.path == IN_STOCK]
        # In flight when wrk stopped, or given up on by wrk, may still commit.
        in_flight = connections * len(mine) + sum(sum(r.socket_errors.values()) for r in mine)
        if not entry["stock_conserved"]:
            found.append(f"{name}: database stock + orders != initial stock ({entry})")
        if not 0 <= entry["unseen_orders"] <= in_flight:
            found.append(
                f"{name}: {entry['orders']} orders for {entry['confirmed_seen_by_wrk']} 201s "
                f"(at most {in_flight} may be unseen)"
            )
        report = entry.get("admin_report")
        if report is not None and (
            report.get("pending") != 0 or report.get("redis_stock") != report.get("db_stock")
        ):
            found.append(f"{name}: Redis and PostgreSQL disagree once settled ({report})")
    return found


def plot(rows: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """Throughput and latency per path and target, as a PNG (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['target']}\n{r['path']}" for r in rows]
    colors = {"bare": "#888888", "gateway": "#1f77b4", "nometrics": "#17becf", "naive": "#d62728"}
    bar_colors = [colors.get(r["target"], "#2ca02c") for r in rows]
    xs = range(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    left.bar(xs, [r["rps"] for r in rows], color=bar_colors)
    left.set_xticks(list(xs), labels)
    left.set_ylabel("requests/s")
    left.set_title("Throughput")
    for x, r in zip(xs, rows, strict=True):
        left.annotate(f"{r['rps']:,.0f}", (x, r["rps"]), ha="center", va="bottom", fontsize=8)
    width = 0.4
    right.bar([x - width / 2 for x in xs], [r["p50_ms"] for r in rows], width, color=bar_colors)
    right.bar(
        [x + width / 2 for x in xs],
        [r["p99_ms"] for r in rows],
        width,
        color=bar_colors,
        alpha=0.5,
        hatch="//",
    )
    right.set_xticks(list(xs), labels)
    right.set_yscale("log")
    right.set_ylabel("ms (log scale)")
    right.set_title("Latency: p50 (solid), p99 (hatched)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
    targets, databases = start_targets(harness, config)
    memory = {name: {"idle": t.memory()} for name, t in targets.items()}
    runs = run_all(targets, config, harness.run_id)
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
        "load_average": {"before": load_before, "after": machine.load_average()},
        "summary": rows,
        "runs": [r.as_json() for r in runs],
        "memory_kib": memory,
        "audit": checks,
        "log_problems": problems,
        "stopped": stopped,
        "gateway_settings": passthrough_settings(),
        "audit_failures": audit_failures(checks, runs, config.connections),
    }


def report(results: dict[str, Any], out_dir: Path) -> None:
    """Print the table and notes; write latest.json and latest.png."""
    table = format_table(results["summary"])
    print()
    print(table)
    gw = results["memory_kib"]["gateway"]
    print(
        f"\ngateway RSS: idle {gw['idle'].get('VmRSS', 0) / 1024:.1f} MiB, "
        f"end {gw['end'].get('VmRSS', 0) / 1024:.1f} MiB, "
        f"peak {gw['end'].get('VmHWM', 0) / 1024:.1f} MiB"
    )
    print(f"audit: {json.dumps(results['audit'])}")
    for failure in results["audit_failures"]:
        print(f"AUDIT FAILED: {failure}", file=sys.stderr)
    print(f"log problems: {json.dumps(results['log_problems'])}")
    print(f"stopped: {json.dumps(results['stopped'])}")
    print(f"load average before/after: {results['load_average']}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "latest.json").write_text(json.dumps(results, indent=2) + "\n")
    info = results["machine"]
    title = (
        f"flash-sale gateway vs baselines - {info['nproc']} CPUs {info['cpu_model']} - "
        f"wrk {results['config']['connections']} connections, "
        f"{results['config']['duration_s']} s per run"
    )
    plot(results["summary"], out_dir / "latest.png", title)
    print(f"wrote {out_dir / 'latest.json'} and {out_dir / 'latest.png'}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m loadtests.bench``."""
    config = config_from(argv)
    try:
        wrk.find_wrk()
        with signals_interrupt(), Harness(db_settings=config.db_settings) as harness:
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
