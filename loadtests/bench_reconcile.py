"""A reconcile pass's cost against the skus ever sold: the active ones alone count.

    python -m loadtests.bench_reconcile [--rounds 15] [--active 10] [--idle 2000]
        [--pg-url URL] [--redis-url URL]

Two databases and two Redis key prefixes of their own (``loadtests.lib.harness``,
removed at the end), each with a gateway's reconciler wired as ``gateway.app``
wires it, in this process, on uvloop: **alone** holds ``--active`` skus on sale
(100 units each, one order taken); **mixed** holds the same plus ``--idle``
sold-out ones (stock 0, one order each, Redis counter 0), as a shop has after
months of sales. The process has the gateway's collector thresholds. Each
round times one pass over each (``reconcile_all``, what every instance runs
each ``GATEWAY_RECONCILE_INTERVAL_S``), in turn, the order
swapped every round; the first pass of each, untimed, is the full pass an
instance makes at its start (it finds the sold-out skus idle). Then one full
pass over mixed is timed, as after the change feed resumed: what every pass
cost before skus were active or idle.

Prints a Markdown table (median, min-max over the rounds) and the ratio of the
medians, mixed over alone; issue 33's target is at most 1.5. Exit status 1 when
a pass visited a sku it should not have (an idle one) or left out an active one.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import uvloop

from gateway.app import Opened, build_gateway
from gateway.domain.skus import IfMissing
from gateway.lock import load_lock_scripts
from gateway.ops.metrics import Metrics
from gateway.postgres.database import create_pool
from gateway.postgres.orders import Orders
from gateway.redis.connections import create_redis
from gateway.redis.layout import SkuKeys
from gateway.server import GC_THRESHOLDS
from gateway.settings import Settings
from gateway.usecases.reconciler import Reconciler
from loadtests.lib import machine
from loadtests.lib.harness import Harness
from loadtests.lib.options import PG_URL, REDIS_URL
from loadtests.lib.signals import signals_interrupt

TARGET = 1.5
STOCK = 100

ADD_IDLE = """
WITH made AS (
    INSERT INTO inventory (sku, stock) SELECT 'idle-' || n, 0 FROM generate_series(1, $1) AS n
    RETURNING sku
), moved AS (
    INSERT INTO stock_movements (sku, delta, reason, stock_after)
    SELECT sku, 1, 'set', 1 FROM made
)
INSERT INTO orders (request_id, sku, user_id, qty) SELECT sku || '.r', sku, 'u', 1 FROM made
"""
SELL_ONE = """
WITH taken AS (UPDATE inventory SET stock = stock - 1, updated_at = now() WHERE sku = $1)
INSERT INTO orders (request_id, sku, user_id, qty) VALUES ($1 || '.r', $1, 'u', 1)
"""


@dataclass
class Rig:
    """One database's reconciler, and what to close."""

    name: str
    opened: Opened
    reconciler: Reconciler
    active: list[str]
    idle: int

    @classmethod
    async def open(
        cls, name: str, url: str, redis_url: str, prefix: str, idle: int, active: int
    ) -> Rig:
        """Wire a gateway's reconciler on ``url``; create the skus."""
        settings = Settings(database_url=url, redis_url=redis_url, key_prefix=prefix)
        pool = await create_pool(settings)
        redis = create_redis(settings)
        opened = Opened(settings, Metrics(), redis, pool, Orders(pool))
        gateway = build_gateway(opened)
        await gateway.flushing.reservations.load_scripts()
        await load_lock_scripts(redis)
        skus = [f"live-{i}" for i in range(active)]
        for sku in skus:
            await gateway.admin.change_sku(sku, {"stock": STOCK}, if_missing=IfMissing.CREATE)
            await pool.execute(SELL_ONE, sku)
            # Redis in step with the order taken (no drift to repair in the passes).
            await gateway.admin.change_sku(sku, {"stock": STOCK - 1}, if_missing=IfMissing.REFUSE)
        if idle:
            await pool.execute(ADD_IDLE, idle)
            names = [f"idle-{n}" for n in range(1, idle + 1)]
            await redis.mset({SkuKeys.of(prefix, sku).stock: 0 for sku in names})
        return cls(name, opened, gateway.reconciler, skus, idle)

    async def timed_pass(self) -> tuple[float, int]:
        """One pass: its seconds and the skus it visited (checked to be the active ones)."""
        start = time.perf_counter()
        done = await self.reconciler.reconcile_all()
        took = time.perf_counter() - start
        if sorted(done) != sorted(self.active):
            raise RuntimeError(
                f"{self.name}: the pass visited {len(done)} skus, not the active ones"
            )
        return took, len(done)

    async def close(self) -> None:
        """Close the pool and the client."""
        await self.opened.pool.close()
        await self.opened.redis.aclose()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench_reconcile")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--active", type=int, default=10)
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--pg-url", default=PG_URL)
    parser.add_argument("--redis-url", default=REDIS_URL)
    return parser.parse_args(argv)


def spread(values: list[float]) -> str:
    """Median (min-max), in milliseconds."""
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):.1f} ({min(ms):.1f}-{max(ms):.1f})"


async def measure(harness: Harness, config: argparse.Namespace) -> int:
    """Every round's passes; prints the table; the exit status."""
    rigs = [
        await Rig.open(
            name,
            harness.database(name),
            harness.redis_url,
            f"{harness.key_prefix}:{name}",
            idle,
            config.active,
        )
        for name, idle in (("alone", 0), ("mixed", config.idle))
    ]
    try:
        for rig in rigs:  # an instance's first pass: every sku, the sold-out ones found idle
            await rig.reconciler.reconcile_all()
        times: dict[str, list[float]] = {rig.name: [] for rig in rigs}
        for n in range(config.rounds):
            for rig in rigs if n % 2 == 0 else rigs[::-1]:
                took, _ = await rig.timed_pass()
                times[rig.name].append(took)
        mixed = rigs[1]
        full: list[float] = []
        for _ in range(3):
            mixed.reconciler.feed_resumed()
            start = time.perf_counter()
            done = await mixed.reconciler.reconcile_all()
            full.append(time.perf_counter() - start)
            assert len(done) == config.active + config.idle
    finally:
        for rig in rigs:
            await rig.close()
    ratio = statistics.median(times["mixed"]) / statistics.median(times["alone"])
    total = config.active + config.idle
    print(
        f"| pass | skus in the inventory | skus visited | ms, median (min-max) of {config.rounds} |"
    )
    print("| --- | --- | --- | --- |")
    active = config.active
    print(f"| {active} active alone | {active} | {active} | {spread(times['alone'])} |")
    print(
        f"| {config.active} active + {config.idle} idle | {total} | {config.active}"
        f" | {spread(times['mixed'])} |"
    )
    print(f"| full pass (as every pass before) | {total} | {total} | {spread(full)} (3) |")
    verdict = "within" if ratio <= TARGET else "OVER"
    print(f"\nmixed / alone, medians: {ratio:.2f}x ({verdict} the {TARGET}x target)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m loadtests.bench_reconcile``."""
    config = parse(argv)
    gc.set_threshold(*GC_THRESHOLDS)  # the gateway's own, as it serves
    load_before = machine.load_average()
    try:
        with (
            signals_interrupt(),
            Harness(pg_url=config.pg_url, redis_url=config.redis_url) as harness,
            asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
        ):
            status = runner.run(measure(harness, config))
    except KeyboardInterrupt:
        print("bench_reconcile: interrupted; its databases and keys were removed", file=sys.stderr)
        return 130
    except (RuntimeError, OSError) as exc:
        print(f"bench_reconcile: {exc}", file=sys.stderr)
        return 1
    print(f"load average before: {load_before}, after: {machine.load_average()}")
    return status


if __name__ == "__main__":
    sys.exit(main())
