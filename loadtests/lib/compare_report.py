"""The comparison's results: ``loadtests/results/compare.json``, the table and chart of
``docs/strategies.md`` (and ``docs/strategies.png``).

The doc is generated whole, except the text between the recommendation markers,
which is written by hand from the numbers and kept when the doc is generated again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.lib.options import REPO_ROOT, RESULTS_DIR

DOC = REPO_ROOT / "docs" / "strategies.md"
CHART = REPO_ROOT / "docs" / "strategies.png"
JSON = RESULTS_DIR / "compare.json"
BEGIN, END = "<!-- recommendation: kept when regenerated -->", "<!-- end of recommendation -->"

HEADER = (
    "| strategy | lock | condition | confirmed/s | p50 ms | p99 ms | p99.9 ms"
    " | lock wait mean / p99 ms | locks lost | fenced out | flush failures"
    " | 503 rate | retries | oversell | unsold | lost | audit |"
)

# Why some combinations are not run: the doc says it, the matrix skips them.
NOT_RUN = """\
- `sql-direct`, `optimistic` and `pessimistic` take no flush lock: each purchase is
  its own transaction on the inventory row (the row lock, or the version check, is
  their only serialization). They run once, with `lock=none`; a flush lock around
  them would only add a round trip.
- `reserve-batch` and `queue` write batches through one flusher per sku and run with
  every lock family. `none` is their baseline: PostgreSQL's row lock and the stock
  guard alone keep two flushers of a sku honest, and the lock only saves the work
  of a flush the guard or the fence would refuse.
- The `failover` condition fails Redis over; ZooKeeper rows have a ZooKeeper
  session expiry instead (their Redis stays up), which is the fault that loses a
  ZooKeeper lock. A PostgreSQL failover is not measured here.
"""


def _load(averages: Any) -> str:
    return "unknown" if not averages else " / ".join(f"{a:.1f}" for a in averages)


def cell_ms(value: float | None) -> str:
    """Milliseconds, short ("-": nothing measured)."""
    if value is None:
        return "-"
    if value == float("inf"):
        return ">5000"
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def row_cells(row: dict[str, Any]) -> list[str]:
    """The table cells of one measured row."""
    lat, wait = row["latency_ms"], row["lock_wait_ms"]
    failures = ", ".join(f"{k} {v:g}" for k, v in sorted(row["flush_failures"].items())) or "-"
    return [
        row["strategy"],
        row["lock"],
        row["condition"],
        f"{row['confirmed_per_s']:,.0f}",
        cell_ms(lat["p50"]),
        cell_ms(lat["p99"]),
        cell_ms(lat["p99.9"]),
        f"{cell_ms(wait['mean'])} / {cell_ms(wait['p99'])}",
        f"{row['locks_lost']:g}",
        f"{row['fenced_out']:g}",
        failures,
        f"{row['failure_rate']:.1%}",
        f"{row['retries']:g}",
        str(row["oversell"]),
        str(row["unsold"]),
        str(row["lost"]),
        "clean" if row["audit_exit"] == 0 else f"exit {row['audit_exit']}",
    ]


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The Markdown table of the measured rows."""
    separator = "|" + "---|" * HEADER.count(" | ") + "---|"
    lines = [HEADER, separator]
    lines += ["| " + " | ".join(row_cells(r)) + " |" for r in rows if "skipped" not in r]
    return "\n".join(lines)


def skipped_list(rows: Sequence[dict[str, Any]]) -> str:
    """One line per skipped combination (conditions folded), or a line saying none."""
    reasons: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        if "skipped" in r:
            reasons.setdefault((r["strategy"], r["lock"], r["skipped"]), []).append(r["condition"])
    if not reasons:
        return "None: every combination ran.\n"
    return "".join(
        f"- `{s}` / `{lock}` ({', '.join(conds)}): {why}\n"
        for (s, lock, why), conds in reasons.items()
    )


def observations(rows: Sequence[dict[str, Any]]) -> str:
    """Facts drawn from the numbers, for the recommendation to start from."""
    ran = [r for r in rows if "skipped" not in r]
    if not ran:
        return "- Nothing ran.\n"
    lines = []
    for condition in ("none", "stall", "failover"):
        of = [r for r in ran if r["condition"] == condition]
        if of:
            best = max(of, key=lambda r: r["confirmed_per_s"])
            p99 = cell_ms(best["latency_ms"]["p99"])
            lines.append(
                f"- Fastest under `{condition}`: `{best['strategy']}` with `{best['lock']}`,"
                f" {best['confirmed_per_s']:,.0f} confirmed/s (p99 {p99} ms)."
            )
    bad = [r for r in ran if r["oversell"] or r["lost"]]
    lines.append(
        "- Oversell and lost stock: none in any row."
        if not bad
        else "- **Oversold or lost stock:** "
        + ", ".join(f"`{r['strategy']}/{r['lock']}/{r['condition']}`" for r in bad)
    )
    lost = [r for r in ran if r["locks_lost"]]
    if lost:
        lines.append(
            "- Locks lost (and the fence then refusing the stale holder): "
            + ", ".join(
                f"`{r['strategy']}/{r['lock']}/{r['condition']}` {r['locks_lost']:g} lost,"
                f" {r['fenced_out']:g} fenced"
                for r in lost
            )
            + "."
        )
    return "\n".join(lines) + "\n"


def keep_recommendation(previous: str | None) -> str:
    """The hand-written recommendation of the previous doc, or the starting text."""
    if previous and BEGIN in previous and END in previous:
        return previous.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")
    return (
        "Written by hand from a full run's numbers (every strategy merged), and kept"
        " when the doc is generated again: when each choice fits, from the table above."
    )


def document(
    rows: Sequence[dict[str, Any]],
    *,
    machine: dict[str, Any],
    pinning: str,
    command: str,
    options: dict[str, Any],
    seconds: float,
    chart: bool,
    previous: str | None,
) -> str:
    """The whole of docs/strategies.md."""
    chart_line = (
        "![confirmed/s per combination and condition](strategies.png)\n"
        if chart
        else "(No chart: matplotlib is not installed;"
        " `pip install -c requirements.lock -e '.[bench]'`.)\n"
    )
    return f"""# Deduction strategies and lock families, measured

Generated by `{command}` (`loadtests/compare.py`; raw numbers in
`loadtests/results/compare.json`). Two gateway processes share one database, one
Redis and one sku of {options["stock"]:,} units; two wrk processes (one per gateway,
{options["connections"]} connections each, every request a new buyer) send far more
purchases than there is stock for {options["seconds"]:g} s per row; a fault strikes
{options.get("fault_at_s", 0):g} s in. Lock lease {options.get("lease_s", 0):g} s. Then the
reconciler settles what the fault left and `flashsale-gateway audit` checks the books.
The whole run took {seconds:,.0f} s.

**Machine:** {machine.get("nproc")} cores ({machine.get("cpu_model")}), {machine.get("mem_total")},
Python {machine.get("python")}, {machine.get("wrk")}, commit {machine.get("commit")}
{"(with uncommitted changes)" if machine.get("dirty") else ""}; {pinning}; load average
(1, 5, 15 min) {_load(machine.get("load_average_before"))} before the run and
{_load(machine.get("load_average_after"))} after: other work on the machine slows every row alike.

## Conditions

- `none`: no fault.
- `stall`: the process holding the sku's flush lock is SIGSTOPped for twice the
  lease, then continued (PostgreSQL and `none` do not say who holds: the second
  gateway is stopped).
- `failover`: the Redis primary is killed and Sentinel promotes the replica;
  ZooKeeper rows: ZooKeeper is unreachable for longer than the session timeout,
  so every session expires.

## Columns

confirmed/s: units sold over the time it took to sell them (the database's
count, sampled every 50 ms). Latency: wrk on the gateway that was not stopped
("-": it completed no request in the round). Rows with a fault run longer than
the others by the fault's length, so that recovery shows.
The seed's three health signals: lock wait (mean / p99, from
`flashsale_lock_wait_seconds`), locks lost (`flashsale_locks_lost_total`), and the
deduction failure rate: flush failures by reason and the share of purchases
answered 503. Retries: any `*retries*` metric (the optimistic strategy's).
Oversell must be 0; unsold is the stock the database still holds after the
reconciler settled; lost is stock minus sold minus unsold (must be 0); audit is
`flashsale-gateway audit --sku`.

## Results

{table(rows)}

{chart_line}
### Not run

{NOT_RUN}
### Skipped in this run

{skipped_list(rows)}
## Recommendation

What the numbers say:

{observations(rows)}
{BEGIN}
{keep_recommendation(previous)}
{END}
"""


def draw_chart(rows: Sequence[dict[str, Any]], path: Path) -> bool:
    """A grouped bar chart of confirmed/s; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ran = [r for r in rows if "skipped" not in r]
    combos = list(dict.fromkeys(f"{r['strategy']}\n{r['lock']}" for r in ran))
    conditions = list(dict.fromkeys(r["condition"] for r in ran))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(combos)), 4))
    width = 0.8 / max(1, len(conditions))
    for i, condition in enumerate(conditions):
        values = {
            f"{r['strategy']}\n{r['lock']}": r["confirmed_per_s"]
            for r in ran
            if r["condition"] == condition
        }
        xs = [j + i * width for j in range(len(combos))]
        ax.bar(xs, [values.get(c, 0) for c in combos], width, label=condition)
    ax.set_xticks([j + width * (len(conditions) - 1) / 2 for j in range(len(combos))])
    ax.set_xticklabels(combos, fontsize=8)
    ax.set_ylabel("confirmed/s")
    ax.set_title("Confirmed purchases per second, by strategy / lock and fault")
    ax.legend(title="condition")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_results(
    rows: Sequence[dict[str, Any]],
    *,
    machine: dict[str, Any],
    pinning: str,
    command: str,
    options: dict[str, Any],
    seconds: float,
) -> None:
    """Write compare.json, the chart and docs/strategies.md."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine, "pinning": pinning, "command": command, "rows": list(rows)}
    JSON.write_text(json.dumps({**payload, "options": options}, indent=2, default=str) + "\n")
    chart = draw_chart(rows, CHART)
    previous = DOC.read_text() if DOC.exists() else None
    DOC.write_text(
        document(
            rows,
            machine=machine,
            pinning=pinning,
            command=command,
            options=options,
            seconds=seconds,
            chart=chart,
            previous=previous,
        )
    )
    print(f"wrote {JSON.relative_to(REPO_ROOT)} and {DOC.relative_to(REPO_ROOT)}", flush=True)
