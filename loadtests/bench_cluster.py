"""How far one hot sku goes: 1 and 2 workers, on one Redis and on a Redis Cluster.

``python -m loadtests.bench_cluster [--rounds 5] [--duration 3]`` starts a private
Redis Cluster (3 primaries, 3 replicas, ``testkit.redis_cluster``) and four
gateways, each on a database of its own: workers 1 and 2, on the shared Redis and
on the cluster. Rounds interleave the four (so a neighbour's load on this shared
machine spreads over all of them); each round is one wrk run of new buyers of one
hot sku with ample stock, pinned as ``loadtests.lib.pinning`` says. Between /metrics
scrapes before and after a run come the sku's flush figures: confirmed/s, flushes/s,
mean batch size and mean flush time (lock held, ``flush_batch()`` committed, settle).
Prints one Markdown row per gateway: medians over the rounds with min-max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any, Protocol

from loadtests.lib import wrk
from loadtests.lib.harness import Harness
from loadtests.lib.pinning import choose
from testkit.redis_cluster import LocalRedisCluster

SKU = "hot"
STOCK = 50_000_000
FLUSH = ("flashsale_batch_size_sum", "flashsale_batch_size_count")
FLUSH_S = ("flashsale_flush_duration_seconds_sum", "flashsale_flush_duration_seconds_count")


def configurations(cluster_nodes: str) -> dict[str, dict[str, str]]:
    """Name -> the GATEWAY_* settings of each gateway under test."""
    cluster = {"GATEWAY_REDIS_CLUSTER_NODES": cluster_nodes}
    return {
        "redis-w1": {},
        "redis-w2": {"GATEWAY_WORKERS": "2"},
        "cluster-w1": cluster,
        "cluster-w2": {**cluster, "GATEWAY_WORKERS": "2"},
    }


class Measured(Protocol):
    """What a run needs of its target: a name, where buyers go, and its metrics."""

    @property
    def name(self) -> str: ...
    @property
    def url(self) -> str: ...
    def scrape(self, prefix: str = ...) -> dict[str, float]: ...


def measure(target: Measured, round_: int, args: argparse.Namespace, pin: Any) -> dict[str, float]:
    """One wrk run against ``target``: requests/s, p99 and the sku's flush figures."""
    before = target.scrape()
    raw = wrk.run(
        target.url,
        sku=SKU,
        tag=f"{target.name}{round_}{time.monotonic_ns()}",
        duration_s=args.duration,
        connections=args.connections,
        pinning=pin,
    )
    after = target.scrape()
    result = wrk.to_result(target.name, "/v1/purchase", round_, raw, time.time())
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in (*FLUSH, *FLUSH_S)}
    flushes = delta[FLUSH[1]] or 1.0
    return {
        "rps": result.rps,
        "confirmed_per_s": result.statuses.get("201", 0) / result.duration_s,
        "errors": float(result.errors),
        "p99_ms": result.latency_ms["p99"],
        "flushes_per_s": delta[FLUSH[1]] / result.duration_s,
        "batch": delta[FLUSH[0]] / flushes,
        "flush_ms": 1000 * delta[FLUSH_S[0]] / flushes,
    }


def spread(values: Sequence[float]) -> str:
    """``median (min-max)`` with no decimals above 100, one below."""
    digits = 0 if statistics.median(values) >= 100 else 1
    med, low, high = statistics.median(values), min(values), max(values)
    return f"{med:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def table(runs: dict[str, list[dict[str, float]]]) -> str:
    """One Markdown row per gateway."""
    columns = ("rps", "confirmed_per_s", "p99_ms", "flushes_per_s", "batch", "flush_ms")
    lines = [
        "| gateway | " + " | ".join(columns) + " | errors |",
        "| --- |" + " --- |" * (len(columns) + 1),
    ]
    for name, rows in runs.items():
        cells = [spread([r[c] for r in rows]) for c in columns]
        errors = sum(r["errors"] for r in rows)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {errors:.0f} |")
    return "\n".join(lines)


def options(description: str, argv: Sequence[str] | None) -> argparse.Namespace:
    """The flags of a one-hot-sku run (rounds, duration, connections, --no-pin)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--no-pin", action="store_true", help="let the kernel place everything")
    return parser.parse_args(argv)


def interleave(
    targets: Sequence[Measured], args: argparse.Namespace, pin: Any
) -> dict[str, list[dict[str, float]]]:
    """Every target once a round, ``args.rounds`` rounds after a dropped warm-up."""
    runs: dict[str, list[dict[str, float]]] = {t.name: [] for t in targets}
    for round_ in range(-1, args.rounds):  # round -1 warms up and is dropped
        for target in targets:
            row = measure(target, round_, args, pin)
            if round_ >= 0:
                runs[target.name].append(row)
    return runs


def main(argv: Sequence[str] | None = None) -> None:
    """Run the interleaved rounds and print the table (and the raw rows as JSON)."""
    args = options(__doc__.splitlines()[0], argv)
    pinning = choose(enabled=not args.no_pin)
    cluster = LocalRedisCluster()
    asyncio.run(cluster.start())
    try:
        with Harness(pinning=pinning) as harness:
            targets = []
            for name, settings in configurations(cluster.startup_nodes).items():
                target = harness.start_gateway(harness.database(name), name, settings)
                target.put_sku(SKU, STOCK)
                targets.append(target)
            runs = interleave(targets, args, pinning)
            print(f"{args.rounds} rounds of {args.duration:g} s, {pinning.describe()}")
            print(table(runs))
            print(json.dumps(runs))
    finally:
        asyncio.run(cluster.close())


if __name__ == "__main__":
    main()
