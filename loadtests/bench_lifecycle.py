"""The order lifecycle under a sale: expiries and cancels given back and sold again.

``python -m loadtests.bench_lifecycle`` starts one gateway (pinned as the other
benches, loadtests.lib.pinning) on a database and key prefix of its own, then:

1. **idle**: the gateway with nothing pending, ``--idle`` seconds: what its
   sweep costs when there is nothing to expire (it looks every
   ``GATEWAY_EXPIRY_SWEEP_S``);
2. **the sale**: ``--units`` units with ``--window`` seconds to pay, bought by
   new buyers until every unit is paid (loadtests.lib.lifecycle_sale: 30 % never
   pay, 10 % cancel, the rest pay, resold units alike);
3. **the sweep's cost**: ``--hold-units`` units of another sku bought and never
   paid, then expired by the sweep all within the spread of their deadlines:
   the gateway's and its PostgreSQL backends' CPU during that burst against
   idle;
4. **the books**: ``flashsale-gateway audit`` (``make audit``) over both skus.

``--reconcile`` sets the reconciler's interval: a short one makes its passes
meet the returns often, which shows whether they ever take one for drift
(``warning:drift_repaired`` among the problems logged).

It reports the return lag (deadline to back on sale) from the gateway's
``flashsale_order_return_lag_seconds`` and from outside (a return to its unit
sold again), and checks that every unit ended paid, that the resales equal the
returns (the buyers' count, the orders, the ``stock_movements`` rows) and the
audit; it exits 1 when a check fails. Every loop is bounded in time and count.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from loadtests.lib.harness import Harness
from loadtests.lib.lifecycle_probe import (
    CpuSnapshot,
    books,
    bucket_quantile,
    cpu_snapshot,
    lag_buckets,
    minus,
    outstanding,
    percentiles,
)
from loadtests.lib.lifecycle_sale import CANCEL, EXPIRE, Sale, SaleLog, SalePlan
from loadtests.lib.machine import describe, load_average
from loadtests.lib.options import RESULTS_DIR
from loadtests.lib.pinning import choose
from loadtests.lib.signals import signals_interrupt
from loadtests.lib.targets import Target
from testkit.http import http

SALE_SKU, HOLD_SKU = "lifecycle-sale", "lifecycle-hold"
GATEWAY = "gateway"
# How often the sweep's burst is looked at in PostgreSQL, and the longest it may
# last after the last deadline.
POLL_S = 0.05
BURST_GRACE_S = 60.0
# One reconciler pass (GATEWAY_RECONCILE_INTERVAL_S, 5 s by default) and a margin.
RECONCILE_WAIT_S = 6.0


def put_sku(target: Target, sku: str, units: int, window_s: int) -> None:
    """Create ``sku`` with ``units`` units, one a buyer, ``window_s`` seconds to pay."""
    body = {"stock": units, "per_user_limit": 1, "payment_window_s": window_s}
    status, answer = http("PUT", f"{target.url}/admin/skus/{sku}", body, token=target.admin_token)
    if status != 200:
        raise RuntimeError(f"PUT /admin/skus/{sku} answered {status}: {answer}")


def cpu_rates(before: CpuSnapshot, after: CpuSnapshot, seconds: float) -> dict[str, float]:
    """The gateway's and PostgreSQL's CPU between two snapshots, in % of a core."""
    gateway, pg = after.since(before)
    return {
        "seconds": seconds,
        "gateway_cpu_s": gateway,
        "postgres_cpu_s": pg,
        "gateway_pct": 100 * gateway / seconds,
        "postgres_pct": 100 * pg / seconds,
    }


def idle(gateway: Target, database_url: str, seconds: float) -> dict[str, float]:
    """The CPU of the gateway and its backends with nothing pending for ``seconds``."""
    before, started = cpu_snapshot(gateway, database_url), time.monotonic()
    time.sleep(seconds)
    return cpu_rates(before, cpu_snapshot(gateway, database_url), time.monotonic() - started)


async def _hold(url: str, sku: str, units: int, run_id: str, buyers: int) -> list[float]:
    """Buy ``units`` of ``sku`` with new buyers, paying none; their ``pay_by``s."""
    deadlines: list[float] = []
    numbers = itertools.count()
    connector = aiohttp.TCPConnector(limit=buyers)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=30)
    ) as session:

        async def buyer() -> None:
            while len(deadlines) < units:
                n = next(numbers)
                if n >= 3 * units:
                    return
                body = {"sku": sku, "user_id": f"{run_id}-h{n}", "request_id": f"{run_id}-h{n}"}
                async with session.post(f"{url}/v1/purchase", json=body) as response:
                    answer = await response.json(content_type=None)
                if response.status == 201:
                    deadlines.append(datetime.fromisoformat(answer["pay_by"]).timestamp())
                elif response.status == 409:
                    return

        await asyncio.gather(*(buyer() for _ in range(buyers)))
    return deadlines


async def _burst_end(database_url: str, sku: str, last_deadline: float) -> float:
    """When every held order of ``sku`` has expired and its units are back in Redis."""
    con = await asyncpg.connect(database_url)
    try:
        while time.time() < last_deadline + BURST_GRACE_S:
            if time.time() >= last_deadline and await outstanding(con, sku) == 0:
                return time.time()
            await asyncio.sleep(POLL_S)
    finally:
        await con.close()
    raise RuntimeError(f"{sku}: orders still held {BURST_GRACE_S:g} s after the last deadline")


def sweep_cost(
    gateway: Target, database_url: str, units: int, window_s: int, run_id: str, buyers: int
) -> dict[str, Any]:
    """Hold ``units`` units unpaid, then measure the sweep expiring them all."""
    put_sku(gateway, HOLD_SKU, units, window_s)
    deadlines = asyncio.run(_hold(gateway.url, HOLD_SKU, units, run_id, buyers))
    if not deadlines:
        raise RuntimeError(f"{HOLD_SKU}: no unit held")
    first, last = min(deadlines), max(deadlines)
    if time.time() > first - 0.2:
        raise RuntimeError(f"buying {units} units took longer than --hold-window {window_s}")
    time.sleep(first - 0.2 - time.time())
    lag_before, before, started = lag_buckets(gateway), cpu_snapshot(gateway, database_url), first
    ended = asyncio.run(_burst_end(database_url, HOLD_SKU, last))
    after = cpu_snapshot(gateway, database_url)
    lag = minus(lag_buckets(gateway), lag_before)
    cost = cpu_rates(before, after, ended - started + 0.2)
    return {
        **cost,
        "held": len(deadlines),
        "deadline_spread_s": last - first,
        "burst_s": ended - first,
        "after_last_deadline_s": ended - last,
        "lag_buckets": lag,
    }


def run_audit(harness: Harness, database_url: str) -> tuple[int, str]:
    """``flashsale-gateway audit`` over every sku of the run: (exit code, its table)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(
        {
            "GATEWAY_DATABASE_URL": database_url,
            "GATEWAY_REDIS_URL": harness.redis_url,
            "GATEWAY_KEY_PREFIX": f"{harness.key_prefix}:{GATEWAY}",
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "audit"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).strip()


def _warned(table: str) -> bool:
    """Whether an audit table has a row whose verdict is not ``ok``."""
    return any(line.split()[-1] != "ok" for line in table.splitlines()[1:] if line.strip())


def sale_checks(log: SaleLog, units: int, book: dict[str, Any]) -> dict[str, bool]:
    """The sale's invariants, each true when it held."""
    orders, moved = book["orders"], book["movements"]
    resales = len(log.sold) - units
    returned_rows = sum(moved.get(r, [0, 0])[0] for r in ("expired", "cancelled"))
    returned_units = sum(moved.get(r, [0, 0])[1] for r in ("expired", "cancelled"))
    closed = orders.get("expired", 0) + orders.get("cancelled", 0)
    return {
        "every unit paid (buyers)": log.finished and log.paid == units,
        "every unit paid (orders)": orders.get("paid", 0) == units,
        "none pending or confirmed": not orders.get("pending_payment")
        and not orders.get("confirmed"),
        "resales = returns (buyers)": resales == len(log.returns),
        "resales = expired + cancelled orders": resales == closed,
        "resales = return movements (rows and units)": resales == returned_rows == returned_units,
        "stock 0, nothing owed to Redis": book["stock"] == 0 and book["owed"] == 0,
    }


def _quantiles(buckets: dict[float, float]) -> dict[str, float | None]:
    return {
        "n": max(buckets.values(), default=0.0),
        "p50_at_most": bucket_quantile(buckets, 0.5),
        "p99_at_most": bucket_quantile(buckets, 0.99),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every phase; returns the results (``checks`` says which held)."""
    pinning = choose(bool(args.pin))
    token = secrets.token_urlsafe(24)
    results: dict[str, Any] = {"machine": describe(), "pinning": pinning.describe()}
    results["load_before"] = load_average()
    with Harness(pinning=pinning, log_dir=args.log_dir) as harness:
        results["run_id"] = harness.run_id
        database_url = harness.database("lifecycle")
        gateway = harness.start_gateway(
            database_url,
            GATEWAY,
            {
                "GATEWAY_PAYMENT_TOKEN": token,
                "GATEWAY_RECONCILE_INTERVAL_S": str(args.reconcile),
            },
        )
        if pinning.load is not None:
            os.sched_setaffinity(0, {pinning.load})
        results["idle"] = idle(gateway, database_url, args.idle)
        put_sku(gateway, SALE_SKU, args.units, args.window)
        plan = SalePlan(
            url=gateway.url,
            sku=SALE_SKU,
            units=args.units,
            window_s=args.window,
            payment_token=token,
            run_id=harness.run_id,
            buyers=args.buyers,
            poll_s=args.poll,
            timeout_s=args.timeout,
        )
        before = cpu_snapshot(gateway, database_url)
        log = asyncio.run(Sale(plan).run())
        results["sale_cpu"] = cpu_rates(
            before, cpu_snapshot(gateway, database_url), log.ended - log.started
        )
        sale_lag = lag_buckets(gateway)
        book = books(database_url, SALE_SKU)
        lags = log.resold_into_sold_out(args.units)
        results["sale"] = {
            "units": args.units,
            "window_s": args.window,
            "seconds": log.ended - log.started,
            "sold": len(log.sold),
            "resales": len(log.sold) - args.units,
            "returns": {
                "expired": sum(1 for _, f in log.returns if f == EXPIRE),
                "cancelled": sum(1 for _, f in log.returns if f == CANCEL),
            },
            "paid": log.paid,
            "late_payments": log.late_payments,
            "answers": dict(log.answers),
            "books": book,
            "lag_metric": {**_quantiles(sale_lag), "buckets": sale_lag},
            "resold_after_expiry_s": percentiles([s for s, f in lags if f == EXPIRE]),
            "resold_after_cancel_s": percentiles([s for s, f in lags if f == CANCEL]),
            "told_sold_out_after_return_s": percentiles(log.told_sold_out_after_return(args.units)),
            "sold_out_answers": len(log.sold_out),
        }
        checks = sale_checks(log, args.units, book)
        if args.hold_units:
            sweep = sweep_cost(
                gateway,
                database_url,
                args.hold_units,
                args.hold_window,
                harness.run_id,
                args.buyers,
            )
            sweep["lag_metric"] = _quantiles(sweep["lag_buckets"])
            results["sweep"] = sweep
            checks["held units all expired and back"] = books(database_url, HOLD_SKU)["owed"] == 0
        code, table = run_audit(harness, database_url)
        results["audit"] = {"exit": code, "table": table}
        if code == 0 and _warned(table):
            # A warning (DRIFT) the reconciler repairs: its verdict after one pass.
            time.sleep(RECONCILE_WAIT_S)
            code, table = run_audit(harness, database_url)
            results["audit_after_reconcile"] = {"exit": code, "table": table}
        checks["make audit: books balance"] = code == 0
        results["problems_logged"] = gateway.log_problems()
    results["load_after"] = load_average()
    results["checks"] = checks
    return results


def render(r: dict[str, Any]) -> str:
    """The results as the lines docs/performance.md quotes."""
    sale, idle_ = r["sale"], r["idle"]
    lines = [
        f"lifecycle bench ({r['pinning']}; load average before {_load(r['load_before'])},"
        f" after {_load(r['load_after'])})",
        f"sale: {sale['units']:,} units, {sale['window_s']} s to pay, {sale['seconds']:.1f} s:"
        f" {sale['sold']:,} sold ({sale['resales']:,} resales), returns"
        f" {sale['returns']['expired']:,} expired + {sale['returns']['cancelled']:,} cancelled,"
        f" {sale['paid']:,} paid, {sale['late_payments']} late payments",
        f"orders {sale['books']['orders']}; movements (rows, units) {sale['books']['movements']}",
        f"return lag, {_lag_line(sale['lag_metric'])}",
        "from outside, a return into a sold-out sale to its unit sold again:"
        f" deadline {_pct(sale['resold_after_expiry_s'])};"
        f" cancel {_pct(sale['resold_after_cancel_s'])}",
        f"sold out answered {sale['sold_out_answers']:,} times, while a returned unit was"
        f" off sale: {_pct(sale['told_sold_out_after_return_s'])} since it came back",
        f"idle {idle_['seconds']:.1f} s: gateway {idle_['gateway_pct']:.2f} % of a core,"
        f" PostgreSQL {idle_['postgres_pct']:.2f} %",
        f"during the sale: gateway {r['sale_cpu']['gateway_pct']:.1f} %,"
        f" PostgreSQL {r['sale_cpu']['postgres_pct']:.1f} %",
    ]
    if "sweep" in r:
        s = r["sweep"]
        per = 1e6 * (s["gateway_cpu_s"] - idle_["gateway_pct"] / 100 * s["seconds"]) / s["held"]
        per_pg = (
            1e6 * (s["postgres_cpu_s"] - idle_["postgres_pct"] / 100 * s["seconds"]) / s["held"]
        )
        lines += [
            f"sweep: {s['held']:,} held units expired,"
            f" deadlines over {s['deadline_spread_s']:.2f} s,"
            f" all back {s['after_last_deadline_s']:.3f} s after the last;"
            f" gateway {s['gateway_pct']:.1f} % of a core, PostgreSQL {s['postgres_pct']:.1f} %"
            f" over {s['seconds']:.2f} s; above idle: {per:.0f} µs gateway +"
            f" {per_pg:.0f} µs PostgreSQL CPU per expired order",
            f"sweep's return lag, {_lag_line(s['lag_metric'])}",
        ]
    lines.append(r["audit"]["table"])
    if "audit_after_reconcile" in r:
        lines += [f"after {RECONCILE_WAIT_S:g} s:", r["audit_after_reconcile"]["table"]]
    lines += [f"warnings and errors logged: {r['problems_logged'] or 'none'}"]
    lines += [f"{'ok' if held else 'FAILED'}: {name}" for name, held in r["checks"].items()]
    return "\n".join(lines)


def _load(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _lag_line(lag: dict[str, Any]) -> str:
    return (
        f"flashsale_order_return_lag_seconds: {lag['n']:,.0f} observed,"
        f" p50 <= {lag['p50_at_most']} s, p99 <= {lag['p99_at_most']} s (bucket bounds)"
    )


def _pct(p: dict[str, float]) -> str:
    if not p:
        return "no sample"
    return f"p50 {p['p50']:.3f} s, p99 {p['p99']:.3f} s, max {p['max']:.3f} s (n={p['n']:.0f})"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m loadtests.bench_lifecycle``; 1 when a check failed."""
    assert __doc__ is not None
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=10_000, help="units of the sale")
    parser.add_argument("--window", type=int, default=2, help="seconds to pay (at least 1)")
    parser.add_argument(
        "--hold-units",
        type=int,
        default=10_000,
        help="units held unpaid to time the sweep; 0: skip",
    )
    parser.add_argument(
        "--hold-window",
        type=int,
        default=10,
        help="seconds to pay of the held units: longer than buying them takes",
    )
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of the idle measure")
    parser.add_argument("--buyers", type=int, default=32, help="buyers buying at once")
    parser.add_argument(
        "--poll", type=float, default=0.05, help="seconds a buyer waits after a sold-out answer"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="longest the sale may run")
    parser.add_argument(
        "--reconcile",
        type=float,
        default=5.0,
        help="GATEWAY_RECONCILE_INTERVAL_S: shorter passes meet more returns",
    )
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the gateway's log here")
    parser.add_argument("--pin", type=int, default=1, help="0: leave the processes unpinned")
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR / "lifecycle.json", help="the results file"
    )
    args = parser.parse_args(argv)
    if args.window < 1 or args.units < 1:
        parser.error("--window and --units: at least 1")
    with signals_interrupt():
        results = run(args)
    print(render(results), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0 if all(results["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
