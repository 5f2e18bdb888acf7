"""``make compare``: every deduction strategy x lock family under one load and three faults.

For each combination that makes sense (``loadtests.lib.compare_round.matrix``) and
each condition (``loadtests.lib.compare_faults``), two gateway processes share one
database, one Redis key prefix and one sku of ``--stock`` units; two wrk
processes (one per gateway, every request a new buyer) send far more purchases
than there is stock for ``--seconds``, while the fault, if any, strikes 0.3 s
in. Then the reconciler settles what the fault left, ``flashsale-gateway
audit`` checks the books, and the run records (see
``loadtests.lib.compare_measure.measure``): confirmed/s, latency p50/p99/p99.9, the
seed's three health signals from ``/metrics`` (lock wait, locks lost, deduction
failures by reason), retries, oversell, and stock left unsold or lost. A
strategy or lock family the gateway refuses at start-up (or does not know yet)
is skipped with its reason.

The rounds' settings and options are ``loadtests.lib.compare_round``'s, their books
``loadtests.lib.compare_books``'s, each row ``loadtests.lib.compare_measure``'s.
Results go to ``loadtests/results/compare.json`` and ``docs/strategies.md``
(with ``docs/strategies.png``), see ``loadtests.lib.compare_report``.

    python -m loadtests.compare [--strategies a,b] [--locks a,b] [--conditions a,b]
        [--seconds 3] [--stock 2000] [--connections 32] [--no-pin]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from loadtests.lib import machine, wrk
from loadtests.lib.compare_books import SoldSampler, settle_and_audit
from loadtests.lib.compare_faults import (
    CONDITIONS,
    Servers,
    expire_sessions,
    fail_over,
    holder_pid,
    stall_holder,
)
from loadtests.lib.compare_measure import measure, scrape_all
from loadtests.lib.compare_report import cell_ms, write_results
from loadtests.lib.compare_round import (
    FAULT_AT_S,
    LEASE_S,
    LOCKS,
    STRATEGIES,
    Options,
    Round,
    gateway_settings,
    matrix,
    unknown_strategy,
)
from loadtests.lib.harness import Harness
from loadtests.lib.pinning import Pinning, choose
from loadtests.lib.signals import signals_interrupt
from loadtests.lib.targets import Target
from testkit.processes import stop_process


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
