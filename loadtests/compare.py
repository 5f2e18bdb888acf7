"""``make compare``: every deduction strategy x lock family under one load and three faults.

For each combination that makes sense (:func:`matrix`) and each condition
(``loadtests.compare_faults``), two gateway processes share one database, one
Redis key prefix and one sku of ``--stock`` units; two wrk processes (one per
gateway, every request a new buyer) send far more purchases than there is stock
for ``--seconds``, while the fault, if any, strikes 0.3 s in. Then the
reconciler settles what the fault left, ``flashsale-gateway audit`` checks the
books, and the run records (see :func:`measure`): confirmed/s, latency
p50/p99/p99.9, the seed's three health signals from ``/metrics`` (lock wait,
locks lost, deduction failures by reason), retries, oversell, and stock left
unsold or lost. A strategy or lock family the gateway refuses at start-up (or
does not know yet) is skipped with its reason.

Results go to ``loadtests/results/compare.json`` and ``docs/strategies.md``
(with ``docs/strategies.png``), see ``loadtests.compare_report``.

    python -m loadtests.compare [--strategies a,b] [--locks a,b] [--conditions a,b]
        [--seconds 3] [--stock 2000] [--connections 32] [--no-pin]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import asyncpg

from gateway.settings import Settings
from loadtests import machine, wrk
from loadtests.compare_faults import (
    CONDITIONS,
    MASTER,
    Servers,
    expire_sessions,
    fail_over,
    holder_pid,
    stall_holder,
)
from loadtests.compare_report import cell_ms, write_results
from loadtests.harness import Harness
from loadtests.options import REPO_ROOT
from loadtests.pinning import Pinning, choose
from loadtests.signals import signals_interrupt
from loadtests.targets import Target
from tests.support.http import http
from tests.support.metrics import samples
from tests.support.processes import stop_process

STRATEGIES = ("reserve-batch", "sql-direct", "optimistic", "pessimistic", "queue")
LOCKS = ("redis", "postgres", "zookeeper", "none")
# Strategies that write each purchase in its own transaction take no flush lock.
LOCKLESS = ("sql-direct", "optimistic", "pessimistic")
LEASE_S = 1.0  # short, so a stall passes it within a round
# Early, so the fault strikes while the stock is still selling even on a fast machine.
FAULT_AT_S = 0.3
SETTLE_S = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    """What to run and how hard."""

    strategies: tuple[str, ...]
    locks: tuple[str, ...]
    conditions: tuple[str, ...]
    seconds: float
    stock: int
    connections: int
    pin: bool


def matrix(strategies: Sequence[str], locks: Sequence[str]) -> list[tuple[str, str]]:
    """The (strategy, lock) pairs worth running: lockless strategies once, with none."""
    pairs = []
    for strategy in strategies:
        for lock in locks:
            if strategy in LOCKLESS and lock != "none":
                continue
            pairs.append((strategy, lock))
    return pairs


def unknown_strategy(strategy: str) -> str | None:
    """Why this gateway cannot run ``strategy`` before even starting it, or None."""
    known = {f.name for f in dataclasses.fields(Settings)}
    if strategy != "reserve-batch" and "strategy" not in known:
        return "this gateway has no GATEWAY_STRATEGY setting (only reserve-batch)"
    return None


def gateway_settings(
    strategy: str, lock: str, prefix: str, zk_hosts: str | None, sentinels: str | None
) -> dict[str, str]:
    """The GATEWAY_* variables of both gateways of one round."""
    settings = {
        "GATEWAY_FLUSH_LOCK": lock,
        "GATEWAY_LOCK_LEASE_S": str(LEASE_S),
        "GATEWAY_KEY_PREFIX": prefix,
        # The reconciler settles what a fault left within the round's settle time.
        "GATEWAY_RESERVATION_TIMEOUT_S": "2",
        "GATEWAY_RECONCILE_INTERVAL_S": "0.5",
        "GATEWAY_LOG_LEVEL": "warning",
    }
    if strategy != "reserve-batch":
        settings["GATEWAY_STRATEGY"] = strategy
    if zk_hosts is not None:
        settings["GATEWAY_ZOOKEEPER_HOSTS"] = zk_hosts
    if sentinels is not None:
        settings["GATEWAY_REDIS_SENTINELS"] = sentinels
        settings["GATEWAY_REDIS_SENTINEL_MASTER"] = MASTER
    return settings


@dataclasses.dataclass
class Round:
    """One (strategy, lock, condition) run: its gateways and what it needs."""

    strategy: str
    lock: str
    condition: str
    database_url: str
    settings: dict[str, str]
    redis_url: str
    sku: str
    gateways: list[Target] = dataclasses.field(default_factory=list)
    # The gateway a stall stopped: latency is read from the other one.
    stopped: Target | None = None

    @property
    def faulted(self) -> bool:
        """Whether this round strikes a fault (and so runs longer, to show recovery)."""
        return self.condition != "none"


def run_round(
    rnd: Round, opts: Options, servers: Servers, pinning: Pinning, fault: Callable[[], str] | None
) -> dict[str, Any]:
    """Load both gateways with wrk, strike the fault early on; the raw results."""
    gateways = rnd.gateways
    gateways[0].put_sku(rnd.sku, opts.stock)
    sampler = SoldSampler(rnd.database_url, rnd.sku)
    sampler.start()
    started = time.monotonic()
    with ThreadPoolExecutor(len(gateways) + 1) as pool:
        loads = [
            pool.submit(
                wrk.run,
                g.url,
                sku=rnd.sku,
                tag=f"{rnd.condition[0]}{i}",
                # A fault lasts about two leases: the round goes on past it to recover.
                duration_s=opts.seconds + (FAULT_AT_S + 2 * LEASE_S + 1 if rnd.faulted else 0),
                connections=opts.connections,
                threads=1,
                timeout_s=5.0,
                pinning=pinning,
            )
            for i, g in enumerate(gateways)
        ]
        done_fault = None
        if fault is not None:
            time.sleep(FAULT_AT_S)
            done_fault = fault()
        raws = [load.result() for load in loads]
    sampler.stop()
    return {
        "raws": raws,
        "fault": done_fault,
        "sold_curve": sampler.curve,
        "elapsed_s": time.monotonic() - started,
    }


class SoldSampler:
    """Counts the sku's sold units in PostgreSQL every 50 ms, in a thread of its own,
    so confirmed/s is sold units over the time it took to sell them."""

    def __init__(self, database_url: str, sku: str) -> None:
        self._url = database_url
        self._sku = sku
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.curve: list[tuple[float, int]] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.run(self._sample())

    async def _sample(self) -> None:
        con = await asyncpg.connect(self._url)
        started = time.monotonic()
        try:
            while not self._stop.wait(0.05):
                sold = await con.fetchval(SOLD, self._sku)
                self.curve.append((time.monotonic() - started, int(sold or 0)))
        finally:
            await con.close()


SOLD = "SELECT coalesce(sum(qty), 0) FROM orders WHERE sku = $1"
# Units sold and stock left read in one snapshot: a purchase still committing
# while the books are read must not look like a lost unit.
BOOKS = """
SELECT (SELECT coalesce(sum(qty), 0) FROM orders WHERE sku = $1) AS sold,
       (SELECT stock FROM inventory WHERE sku = $1) AS stock
"""


def settle_and_audit(rnd: Round) -> dict[str, Any]:
    """Wait for the reconciler to settle every reservation; the books and the audit."""
    gateway = rnd.gateways[0]
    deadline = time.monotonic() + SETTLE_S
    pending: Any = None
    while time.monotonic() < deadline:
        status, body = http(
            "GET", f"{gateway.url}/admin/skus/{rnd.sku}", token=gateway.admin_token, timeout=3.0
        )
        pending = body.get("pending") if status == 200 and isinstance(body, dict) else None
        if pending == 0:
            break
        time.sleep(0.2)
    sold, db_stock = asyncio.run(_books(rnd.database_url, rnd.sku))
    env = {**rnd.settings, "GATEWAY_DATABASE_URL": rnd.database_url}
    env["GATEWAY_REDIS_URL"] = rnd.redis_url
    audit = subprocess.run(
        [sys.executable, "-m", "gateway", "audit", "--sku", rnd.sku],
        cwd=REPO_ROOT,
        env={**_base_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return {
        "pending_left": pending,
        "sold": sold,
        "db_stock": db_stock,
        "audit_exit": audit.returncode,
        "audit": audit.stdout.strip()[-1000:],
    }


async def _books(database_url: str, sku: str) -> tuple[int, int]:
    con = await asyncpg.connect(database_url)
    try:
        row = await con.fetchrow(BOOKS, sku)
    finally:
        await con.close()
    assert row is not None  # the query always returns one row
    return int(row["sold"] or 0), int(row["stock"] or 0)


def scrape_all(gateways: Sequence[Target]) -> dict[str, float]:
    """Every gateway's /metrics samples, added up series by series."""
    merged: dict[str, float] = {}
    for gateway in gateways:
        try:
            status, text = http("GET", f"{gateway.url}/metrics", timeout=5.0)
        except OSError:
            continue
        if status == 200 and isinstance(text, str):
            for series, value in samples(text).items():
                merged[series] = merged.get(series, 0.0) + value
    return merged


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}


def measure(
    rnd: Round, opts: Options, raw: dict[str, Any], books: dict[str, Any], found: dict[str, float]
) -> dict[str, Any]:
    """One row of the comparison from a round's raw results, books and metrics."""
    statuses: dict[str, int] = {}
    for result in raw["raws"]:
        for status, count in result["statuses"].items():
            statuses[str(status)] = statuses.get(str(status), 0) + int(count)
    requests = sum(int(r["requests"]) for r in raw["raws"])
    observed = next(i for i, g in enumerate(rnd.gateways) if g is not rnd.stopped)
    seen = raw["raws"][observed]
    # A gateway that completed nothing in the round has no latency to speak of.
    latency = {
        q: seen["latency_us"][k] / 1000 if seen["requests"] else None for q, k in LATENCY_KEYS
    }
    sold, db_stock = books["sold"], books["db_stock"]
    sold_in = next((t for t, n in raw["sold_curve"] if n >= sold), raw["elapsed_s"])
    unavailable = _series(found, "flashsale_purchases_total", "outcome").get("unavailable", 0.0)
    return {
        "strategy": rnd.strategy,
        "lock": rnd.lock,
        "condition": rnd.condition,
        "fault": raw["fault"],
        "stock": opts.stock,
        "requests": requests,
        "statuses": statuses,
        "confirmed": sold,
        "confirmed_per_s": round(sold / sold_in, 1) if sold and sold_in > 0 else 0.0,
        "latency_ms": latency,
        "lock_wait_ms": {
            "mean": _mean_ms(found, "flashsale_lock_wait_seconds"),
            "p99": _quantile_ms(found, "flashsale_lock_wait_seconds", 0.99),
        },
        "locks_lost": found.get("flashsale_locks_lost_total", 0.0),
        "fenced_out": found.get("flashsale_fenced_out_total", 0.0),
        "flush_failures": _series(found, "flashsale_flush_failures_total", "reason"),
        "failure_rate": round(unavailable / requests, 4) if requests else 0.0,
        "retries": sum(
            v
            for k, v in found.items()
            if "retries" in (name := k.partition("{")[0]) and not name.endswith("_created")
        ),
        "oversell": max(0, sold - opts.stock),
        "unsold": db_stock,
        "lost": opts.stock - sold - db_stock,
        "pending_left": books["pending_left"],
        "audit_exit": books["audit_exit"],
    }


LATENCY_KEYS = (("p50", "p50"), ("p99", "p99"), ("p99.9", "p999"))


def _series(found: dict[str, float], name: str, label: str) -> dict[str, float]:
    """``name``'s samples by the value of ``label``."""
    out: dict[str, float] = {}
    marker = f'{label}="'
    for series, value in found.items():
        if series.startswith(name + "{") and marker in series:
            key = series.split(marker, 1)[1].split('"', 1)[0]
            out[key] = out.get(key, 0.0) + value
    return out


def _mean_ms(found: dict[str, float], name: str) -> float:
    count = found.get(f"{name}_count", 0.0)
    return round(found.get(f"{name}_sum", 0.0) / count * 1000, 3) if count else 0.0


def _quantile_ms(found: dict[str, float], name: str, q: float) -> float:
    """The upper bound of the histogram bucket holding the ``q`` quantile, in ms."""
    buckets = sorted(
        (float(le), count)
        for le, count in _series(found, f"{name}_bucket", "le").items()
        if le != "+Inf"
    )
    total = found.get(f"{name}_count", 0.0)
    if not total:
        return 0.0
    for le, count in buckets:
        if count >= q * total:
            return le * 1000
    return float("inf")


def run_condition(
    harness: Harness,
    servers: Servers,
    opts: Options,
    pinning: Pinning,
    combo: tuple[str, str, str],
    database_url: str,
) -> dict[str, Any]:
    """Start two gateways for one (strategy, lock, condition), load, fault, measure."""
    strategy, lock, condition = combo
    zk_hosts = servers.start_zookeeper() if lock == "zookeeper" else None
    redis_url, sentinels, cluster = harness.redis_url, None, None
    if condition == "failover" and lock != "zookeeper":
        cluster = servers.sentinel_set()
        sentinels = ",".join(f"{h}:{p}" for h, p in cluster.sentinel_addresses())
    tag = f"{strategy}-{lock}-{condition}"
    prefix = f"{harness.key_prefix}:{tag}"
    settings = gateway_settings(strategy, lock, prefix, zk_hosts, sentinels)
    rnd = Round(strategy, lock, condition, database_url, settings, redis_url, f"sku-{condition}")
    try:
        for side in ("a", "b"):
            rnd.gateways.append(harness.start_gateway(database_url, f"{tag}-{side}", settings))
    except RuntimeError as exc:
        _stop(harness, rnd.gateways)
        return skipped(strategy, lock, condition, f"refused at start-up: {_reason(exc)}")
    fault = _fault(rnd, servers, cluster, zk_hosts)
    try:
        raw = run_round(rnd, opts, servers, pinning, fault)
        books = settle_and_audit(rnd)
        found = scrape_all(rnd.gateways)
    finally:
        _stop(harness, rnd.gateways)
    return measure(rnd, opts, raw, books, found)


def _fault(
    rnd: Round, servers: Servers, cluster: Any, zk_hosts: str | None
) -> Callable[[], str] | None:
    if rnd.condition == "stall":

        def stall() -> str:
            pid = holder_pid(
                rnd.lock,
                redis_url=rnd.redis_url,
                zk_hosts=zk_hosts,
                prefix=rnd.settings["GATEWAY_KEY_PREFIX"],
                sku=rnd.sku,
            )
            done, rnd.stopped = stall_holder(rnd.gateways, pid, 2 * LEASE_S)
            return done

        return stall
    if rnd.condition == "failover":
        if rnd.lock == "zookeeper":
            proxy = servers.zk_proxy
            assert proxy is not None
            return lambda: expire_sessions(proxy, 2 * LEASE_S + 0.5)
        return lambda: fail_over(cluster)
    return None


def _stop(harness: Harness, gateways: list[Target]) -> None:
    for gateway in gateways:
        stop_process(gateway.process)
        if gateway in harness.targets:
            harness.targets.remove(gateway)


def _reason(exc: BaseException) -> str:
    """The line of a failed start that says why (the gateway's last log line)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1][-200:] if lines else type(exc).__name__


def skipped(strategy: str, lock: str, condition: str, reason: str) -> dict[str, Any]:
    """The row of a combination that did not run."""
    print(f"  skip {strategy} / {lock} / {condition}: {reason}", flush=True)
    return {"strategy": strategy, "lock": lock, "condition": condition, "skipped": reason}


def run_all(opts: Options) -> tuple[list[dict[str, Any]], Pinning]:
    """Every combination and condition; the rows, in order."""
    pinning = choose(opts.pin)
    rows: list[dict[str, Any]] = []
    servers = Servers()
    with signals_interrupt(), Harness(pinning=pinning) as harness:
        try:
            for strategy, lock in matrix(opts.strategies, opts.locks):
                reason = unknown_strategy(strategy)
                if reason is not None:
                    rows += [skipped(strategy, lock, c, reason) for c in opts.conditions]
                    continue
                database_url = harness.database(f"{strategy}_{lock}".replace("-", "_"))
                for condition in opts.conditions:
                    combo = (strategy, lock, condition)
                    row = run_condition(harness, servers, opts, pinning, combo, database_url)
                    rows.append(row)
                    if "skipped" not in row:
                        print(f"  {strategy} / {lock} / {condition}: {one_line(row)}", flush=True)
        finally:
            servers.close()
    return rows, pinning


def one_line(row: dict[str, Any]) -> str:
    """A row's headline numbers, for the console."""
    return (
        f"{row['confirmed_per_s']:,.0f} confirmed/s, p99 {cell_ms(row['latency_ms']['p99'])} ms,"
        f" lost locks {row['locks_lost']:g}, oversell {row['oversell']}, lost {row['lost']}"
    )


def parse(argv: Sequence[str] | None) -> Options:
    """The command line (defaults: the full matrix, 3 s rounds)."""
    parser = argparse.ArgumentParser(prog="python -m loadtests.compare", description=__doc__)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--locks", default=",".join(LOCKS))
    parser.add_argument("--conditions", default=",".join(CONDITIONS))
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--stock", type=int, default=2000)
    parser.add_argument("--connections", type=int, default=32, help="per gateway")
    parser.add_argument("--no-pin", action="store_true", help="leave wrk and servers unpinned")
    args = parser.parse_args(argv)

    def split(raw: str, allowed: Sequence[str]) -> tuple[str, ...]:
        items = tuple(item.strip() for item in raw.split(",") if item.strip())
        bad = [item for item in items if item not in allowed]
        if bad:
            parser.error(f"unknown {bad}; choose from {','.join(allowed)}")
        return items

    return Options(
        strategies=split(args.strategies, STRATEGIES),
        locks=split(args.locks, LOCKS),
        conditions=split(args.conditions, CONDITIONS),
        seconds=args.seconds,
        stock=args.stock,
        connections=args.connections,
        pin=not args.no_pin,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison and write its results; 1 if any row oversold or lost stock."""
    opts = parse(argv)
    started = time.monotonic()
    load_before = machine.load_average()
    rows, pinning = run_all(opts)
    command = "make compare" if argv is None and len(sys.argv) <= 1 else " ".join(sys.argv)
    write_results(
        rows,
        # Others share this machine: how busy it was says how far to trust the numbers.
        machine={
            **machine.describe(),
            "load_average_before": load_before,
            "load_average_after": machine.load_average(),
        },
        pinning=pinning.describe(),
        command=command,
        options={**dataclasses.asdict(opts), "lease_s": LEASE_S, "fault_at_s": FAULT_AT_S},
        seconds=time.monotonic() - started,
    )
    bad = [r for r in rows if "skipped" not in r and (r["oversell"] or r["lost"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
