"""The gateway's memory after a very big sale, and through a sold-out storm.

Selling a million units through one gateway on this machine takes the best part
of ten minutes, and what the gateway keeps of a sale is what Redis tells it
once the sku is sold out. So this writes the outcome of a sale of ``--orders``
units straight into the sku's Redis keys and the order rows straight into
PostgreSQL (a ``COPY`` of ``--orders`` rows), exactly as a sale leaves them, then
starts a gateway, sends the first sold-out request (which builds the sku's
replay filter), and drives a sold-out storm with wrk for ``--storm`` seconds,
sampling the gateway's RSS every ``--every`` seconds. A sample of confirmed
request ids is replayed at the end: each must get its order. Last, Redis loses
the sale's keys and a fresh gateway takes the next purchase, which reloads every
order row into Redis on its path: that request's time and CPU are printed.

    python -m loadtests.soldout_memory [--orders 1000000] [--storm 60s]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import threading
import time
import uuid
from typing import Any

import asyncpg

from gateway.connections import create_redis
from gateway.domain import Order
from gateway.inventory import Inventory
from gateway.layout import SkuKeys
from gateway.settings import Settings
from loadtests import wrk
from loadtests.cputime import cpu_seconds
from loadtests.harness import Harness
from loadtests.options import parse_seconds
from loadtests.pinning import choose
from loadtests.signals import signals_interrupt
from loadtests.targets import Target
from tests.support.http import http
from tests.support.processes import stop_process

SKU = "bench-million"
# The stock the sale started with, as the admin API would have recorded it.
MOVEMENT = (
    "INSERT INTO stock_movements (sku, delta, reason, stock_after) VALUES ($1, $2, 'set', $2)"
)
REPLAYS = 200
# The background build of a million ids' filter takes seconds, not minutes.
BUILD_WITHIN_S = 300.0
BUILD_POLL_S = 0.2


async def write_sale(database_url: str, redis_url: str, prefix: str, orders: int) -> list[Order]:
    """The order rows and the Redis keys a sold-out sale of ``orders`` units leaves."""
    made = [
        Order(str(uuid.uuid4()), f"r{uuid.uuid4().hex}", SKU, f"user-{i:09d}", 1)
        for i in range(orders)
    ]
    con = await asyncpg.connect(database_url)
    try:
        await con.execute(
            "INSERT INTO inventory (sku, stock, per_user_limit) VALUES ($1, 0, 1)", SKU
        )
        await con.execute(MOVEMENT, SKU, orders)
        await con.copy_records_to_table(
            "orders",
            records=[(o.order_id, o.request_id, o.sku, o.user_id, o.qty) for o in made],
            columns=["order_id", "request_id", "sku", "user_id", "qty"],
        )
    finally:
        await con.close()
    settings = Settings(redis_url=redis_url, key_prefix=prefix)
    redis = create_redis(settings)
    try:
        inventory = Inventory(redis, settings)
        await inventory.load_scripts()
        await inventory.restore_orders(SKU, made)
        await inventory.load_stock(SKU, 0, reset=True)
    finally:
        await redis.aclose()
    return made


def wait_built(target: Target, within: float = BUILD_WITHIN_S) -> float:
    """Wait until the gateway has built the sku's confirmed-id filter (in the
    background, after the first sold-out answer); the seconds the build took."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = target.scrape()
        if found.get("flashsale_confirmed_id_builds_total", 0) >= 1:
            return found.get("flashsale_confirmed_id_build_seconds_total", 0.0)
        time.sleep(BUILD_POLL_S)
    raise RuntimeError(f"the confirmed-id filter was not built within {within:g} s")


def rss_mib(target: Target) -> float:
    """The gateway's resident memory now."""
    return target.memory().get("VmRSS", 0) / 1024


def storm(target: Target, seconds: float, every: float) -> tuple[list[float], dict[str, Any]]:
    """wrk on the sold-out sku for ``seconds``; RSS samples taken meanwhile."""
    samples: list[float] = []
    result: dict[str, Any] = {}

    def load() -> None:
        result.update(
            wrk.run(
                target.url, sku=SKU, tag="storm", duration_s=seconds, threads=1, pinning=choose()
            )
        )

    thread = threading.Thread(target=load)
    thread.start()
    while thread.is_alive():
        samples.append(round(rss_mib(target), 1))
        thread.join(every)
    samples.append(round(rss_mib(target), 1))
    return samples, result


def run(orders: int, storm_s: float, every: float) -> int:
    """Set up, measure, print; the exit status."""
    pinning = choose()
    with signals_interrupt(), Harness(pinning=pinning) as harness:
        database = harness.database("million")
        prefix = f"{harness.key_prefix}:gateway"
        print(f"writing a sold-out sale of {orders:,} orders ...", flush=True)
        made = asyncio.run(write_sale(database, harness.redis_url, prefix, orders))
        gateway = harness.start_gateway(database)
        idle = rss_mib(gateway)
        cpu_before = cpu_seconds(gateway.pid)
        status, body = http("POST", f"{gateway.url}/v1/purchase", {"sku": SKU, "user_id": "late"})
        assert (status, body) == (409, {"status": "sold_out"}), (status, body)
        build_s = wait_built(gateway)
        build_cpu_s = cpu_seconds(gateway.pid) - cpu_before
        began = time.monotonic()
        after_mark = rss_mib(gateway)
        print(
            f"confirmed-id filter of {orders:,} ids built in the background:"
            f" {build_s:.2f} s, {build_cpu_s:.2f} s of the gateway's CPU",
            flush=True,
        )
        print(f"RSS idle {idle:.1f} MiB; after the sold-out mark {after_mark:.1f} MiB", flush=True)
        samples, result = storm(gateway, storm_s, every)
        rps = result["requests"] / (result["duration_us"] / 1e6)
        print(f"storm: {rps:,.0f} req/s for {storm_s:g} s, statuses {result['statuses']}")
        print(f"RSS samples (MiB, every {every:g} s): {samples}")
        wrong = 0
        for order in random.Random(1).sample(made, min(REPLAYS, len(made))):
            body = {"sku": SKU, "user_id": order.user_id, "request_id": order.request_id}
            status, answer = http("POST", f"{gateway.url}/v1/purchase", body)
            wrong += status != 201 or answer.get("order_id") != order.order_id
        print(f"replays of {REPLAYS} confirmed ids: {REPLAYS - wrong} answered with their order")
        print(f"(measured {time.monotonic() - began:.0f} s after the mark; {pinning.describe()})")
        wrong += reload_after_loss(harness, gateway, database, prefix, made)
        return 1 if wrong else 0


def reload_after_loss(
    harness: Harness, gateway: Target, database: str, prefix: str, made: list[Order]
) -> int:
    """Redis loses the sale's keys and a fresh gateway takes the next purchase:
    it reloads every order row into Redis on that request's path. Prints how
    long that request took and what it cost; the number of wrong answers."""
    stop_process(gateway.process)
    asyncio.run(delete_sale_keys(harness.redis_url, prefix))
    fresh = harness.start_gateway(database)
    cpu_before = cpu_seconds(fresh.pid)
    started = time.monotonic()
    status, body = http("POST", f"{fresh.url}/v1/purchase", {"sku": SKU, "user_id": "later"})
    took = time.monotonic() - started
    print(
        f"after Redis lost the sale: the first purchase reloaded {len(made):,} orders in"
        f" {took:.2f} s ({cpu_seconds(fresh.pid) - cpu_before:.2f} s of the gateway's CPU),"
        f" answered {status}; RSS then {rss_mib(fresh):.1f} MiB",
        flush=True,
    )
    order = made[0]
    replay = {"sku": SKU, "user_id": order.user_id, "request_id": order.request_id}
    status_r, answer = http("POST", f"{fresh.url}/v1/purchase", replay)
    return int((status, body) != (409, {"status": "sold_out"})) + int(
        status_r != 201 or answer.get("order_id") != order.order_id
    )


async def delete_sale_keys(redis_url: str, prefix: str) -> None:
    """Delete the sku's keys, as a Redis restart without persistence would."""
    redis = create_redis(Settings(redis_url=redis_url, key_prefix=prefix))
    try:
        await redis.delete(*SkuKeys.of(prefix, SKU).all())
    finally:
        await redis.aclose()


def main() -> None:
    """Parse the command line and run."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--storm", default="60s")
    parser.add_argument("--every", default="5s")
    args = parser.parse_args()
    sys.exit(run(args.orders, parse_seconds(args.storm), parse_seconds(args.every)))


if __name__ == "__main__":
    main()
