"""The wrk bench's results: one row per target and path, a table, a plot, a file."""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.lib import wrk
from loadtests.lib.bench_openloop import format_open_table, plot_open
from loadtests.lib.bench_paths import BIG_SOLD_OUT, PATH_TARGETS, REFERENCE, SOLD_OUT, VALIDATING


def flush_note(result: wrk.WrkResult) -> str:
    """Batches and flush time of a gateway run, for its progress line ('' if none)."""
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
    references = {}
    for name in (REFERENCE, VALIDATING):
        rates = [r.rps for r in measured if r.target == name]
        references[name] = statistics.median(rates) if rates else 0.0
    bare_rps, validating_rps = references[REFERENCE], references[VALIDATING]
    rows: list[dict[str, Any]] = []
    for path, names in PATH_TARGETS.items():
        for name in names:
            mine = [r for r in measured if r.target == name and r.path == path]
            if not mine:
                continue
            statuses: Counter[str] = Counter()
            for r in mine:
                statuses.update(r.statuses)
            rps = statistics.median(r.rps for r in mine)
            cpu = [r.extra["cpu_us_per_request"] for r in mine if "cpu_us_per_request" in r.extra]
            rows.append(
                {
                    "target": name,
                    "path": path,
                    "rounds": len(mine),
                    "rps": rps,
                    "rps_min": min(r.rps for r in mine),
                    "rps_max": max(r.rps for r in mine),
                    "p50_ms": statistics.median(r.latency_ms["p50"] for r in mine),
                    "p99_ms": statistics.median(r.latency_ms["p99"] for r in mine),
                    "errors": sum(r.errors for r in mine),
                    "ratio_to_bare": rps / bare_rps if bare_rps else None,
                    "ratio_to_validating_bare": rps / validating_rps if validating_rps else None,
                    "cpu_us_per_request": statistics.median(cpu) if cpu else None,
                    "statuses": dict(sorted(statuses.items())),
                }
            )
    small = [r["rps"] for r in rows if (r["target"], r["path"]) == ("gateway", SOLD_OUT)]
    for row in rows:
        # The big sale's sold-out answer against the small sale's, same gateway, same run.
        big = row["path"] == BIG_SOLD_OUT and small
        row["ratio_to_small_sale"] = row["rps"] / small[0] if big else None
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The summary as a Markdown table (readable in a terminal too)."""
    lines = [
        "| target | path | requests/s median (min-max) | p50 ms | p99 ms | errors "
        "| ratio to bare_min | to bare | CPU µs/request | statuses |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for row in rows:
        ratio = row["ratio_to_bare"]
        validating = row.get("ratio_to_validating_bare")
        small = row.get("ratio_to_small_sale")
        ratios = "-" if ratio is None else f"{ratio:.2f}"
        if small is not None:
            ratios += f" ({small:.2f} of the small sale)"
        second = "-" if validating is None else f"{validating:.2f}"
        cpu = row.get("cpu_us_per_request")
        second += " | -" if cpu is None else f" | {cpu:.0f}"
        statuses = " ".join(f"{k}:{v}" for k, v in row["statuses"].items())
        lines.append(
            f"| {row['target']} | {row['path']} | {row['rps']:,.0f} "
            f"({row['rps_min']:,.0f}-{row['rps_max']:,.0f}) | {row['p50_ms']:.2f} | "
            f"{row['p99_ms']:.2f} | {row['errors']} | {ratios} | {second} | {statuses} |"
        )
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """Throughput and latency per path and target, as a PNG (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['target']}\n{r['path']}" for r in rows]
    colors = {
        "bare_min": "#bbbbbb",
        "bare": "#888888",
        "gateway": "#1f77b4",
        "nometrics": "#17becf",
        "naive": "#d62728",
    }
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
    big = results["sales"]["gateway/big"]
    after_sale = big["gateway_memory_after_sale"].get("VmRSS", 0) / 1024
    print(
        f"big sale: {big['units']:,} units in {big['seconds']} s; gateway RSS after it "
        f"{after_sale:.1f} MiB; Redis {big['redis_bytes']['total'] / 2**20:.1f} MiB "
        f"({big['redis_bytes_per_order']} B/order)"
    )
    print(f"pinning: {results['pinning']}")
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
    opened = results.get("open_loop") or []
    if opened:
        print("\nopen loop (latency from the intended send time):\n")
        print(format_open_table(opened))
        plot_open(opened, out_dir / "openloop.png", f"open loop - {title}")
        print(f"wrote {out_dir / 'openloop.png'}")
