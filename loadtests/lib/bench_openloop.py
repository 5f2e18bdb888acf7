"""The bench's open-loop latency runs: fixed rates, latency from the intended send time.

After the closed-loop rounds, each (path, target) of ``OPEN_TARGETS`` is driven
by :mod:`loadtests.lib.openloop` (on the load generator's core) at each share of
``OPEN_LOADS`` (50 % and 80 %) of its own closed-loop median from the same run.
Each run is kept as a :class:`wrk.WrkResult` with ``round`` -2, so the audit
counts its 201s with wrk's; the open-loop details (rate asked and sent, the
generator's own lag, the HdrHistogram) are in ``extra["open_loop"]``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.lib import wrk
from loadtests.lib.bench_paths import OPEN_LOADS, OPEN_TARGETS, SKU_OF
from loadtests.lib.openloop import MARKER
from loadtests.lib.pinning import Pinning
from loadtests.lib.targets import Target

OPEN_ROUND = -2
# Connections the generator may use; a request due while all are busy queues
# in the generator, and its wait is part of its latency.
OPEN_CONNECTIONS = 128


def run_open_loop(
    targets: dict[str, Target],
    rows: Sequence[dict[str, Any]],
    *,
    duration_s: float,
    pinning: Pinning,
    run_id: str,
) -> list[wrk.WrkResult]:
    """Every open-loop run, loads in turn, then paths and targets (see the module)."""
    peak = {(r["target"], r["path"]): r["rps"] for r in rows}
    runs = []
    for load in OPEN_LOADS:
        for path, names in OPEN_TARGETS.items():
            for name in names:
                rate = round(load * peak.get((name, path), 0.0))
                if rate <= 0:
                    continue
                tag = f"{run_id}o{int(load * 100)}"
                result = drive_open(targets[name], path, load, rate, duration_s, pinning, tag)
                runs.append(result)
                lat, info = result.latency_ms, result.extra["open_loop"]
                print(
                    f"  open {int(load * 100)}% {name:8} {path:9} {rate:6d}/s sent "
                    f"{info['achieved_rate']:7.0f}/s  p50 {lat['p50']:7.2f}  p99 {lat['p99']:7.2f}"
                    f"  p99.9 {lat['p999']:7.2f} ms  statuses {result.statuses}"
                    f"{'' if info['sustained'] else '  GENERATOR FELL BEHIND'}",
                    flush=True,
                )
    return runs


def drive_open(
    target: Target,
    path: str,
    load: float,
    rate: int,
    duration_s: float,
    pinning: Pinning,
    tag: str,
) -> wrk.WrkResult:
    """One open-loop run of ``path`` on ``target`` at ``rate`` requests/s."""
    cmd = pinning.load_command(
        [
            sys.executable,
            "-m",
            "loadtests.lib.openloop",
            "--url",
            target.url,
            "--rate",
            str(rate),
            "--duration",
            str(duration_s),
            "--connections",
            str(OPEN_CONNECTIONS),
            "--sku",
            SKU_OF[path],
            "--tag",
            tag,
        ]
    )
    started = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 60, check=False)
    if target.process.poll() is not None:
        raise RuntimeError(f"{target.name} died under load:\n{target.log_tail()}")
    for line in done.stdout.splitlines():
        if line.startswith(MARKER):
            raw: dict[str, Any] = json.loads(line[len(MARKER) :])
            break
    else:
        raise RuntimeError(f"openloop exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    latency = raw["latency_ms"]
    return wrk.WrkResult(
        target=target.name,
        path=path,
        round=OPEN_ROUND,
        requests=int(raw["answered"]),
        duration_s=duration_s,
        statuses=raw["statuses"],
        socket_errors={"connect": 0, "read": int(raw["errors"]), "write": 0, "timeout": 0},
        latency_ms={k: latency.get(k, 0.0) for k in ("p50", "p90", "p99", "p999", "max")}
        | {"mean": 0.0},
        started_at=started,
        extra={"open_loop": {"load": load, **raw}},
    )


def open_rows(runs: Sequence[wrk.WrkResult]) -> list[dict[str, Any]]:
    """One row per open-loop run, for the table, the chart and latest.json."""
    rows = []
    for r in runs:
        if r.round != OPEN_ROUND:
            continue
        info = r.extra["open_loop"]
        rows.append(
            {
                "target": r.target,
                "path": r.path,
                "load": info["load"],
                "rate": info["rate"],
                "achieved_rate": info["achieved_rate"],
                "sustained": info["sustained"],
                "send_lag_p99_ms": info["send_lag_ms"].get("p99", 0.0),
                "p50_ms": r.latency_ms["p50"],
                "p99_ms": r.latency_ms["p99"],
                "p999_ms": r.latency_ms["p999"],
                "max_ms": r.latency_ms["max"],
                "errors": r.errors,
                "statuses": r.statuses,
            }
        )
    return rows


def format_open_table(rows: Sequence[dict[str, Any]]) -> str:
    """The open-loop rows as a Markdown table."""
    lines = [
        "| target | path | load | rate asked/sent | p50 ms | p99 ms | p99.9 ms | max ms "
        "| generator lag p99 ms | errors |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        sent = f"{row['rate']:,.0f}/{row['achieved_rate']:,.0f}"
        if not row["sustained"]:
            sent += " (fell behind)"
        lines.append(
            f"| {row['target']} | {row['path']} | {row['load']:.0%} | {sent} | "
            f"{row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['p999_ms']:.2f} | "
            f"{row['max_ms']:.2f} | {row['send_lag_p99_ms']:.2f} | {row['errors']} |"
        )
    return "\n".join(lines)


def plot_open(rows: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """p50, p99 and p99.9 of every open-loop run as grouped bars (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['target']}\n{r['path']}\n{r['load']:.0%}" for r in rows]
    xs = range(len(rows))
    width = 0.27
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(rows)), 4.8))
    for shift, key, name in ((-1, "p50_ms", "p50"), (0, "p99_ms", "p99"), (1, "p999_ms", "p99.9")):
        values = [r[key] for r in rows]
        ax.bar([x + shift * width for x in xs], values, width, label=name)
        for x, v in zip(xs, values, strict=True):
            ax.annotate(f"{v:.1f}", (x + shift * width, v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms from the intended send time (log scale)")
    ax.legend()
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
