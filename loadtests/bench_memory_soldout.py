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
the sale's keys and a fresh gateway takes the next purchase: its latency is
printed, then a sold-out storm of the same length runs while the gateway
rebuilds the sale's hashes in the background, with replays of confirmed ids
sent during it; its rate (against the first storm's), p99, the event loop's
lag (``flashsale_event_loop_lag_seconds``) from the first purchase to the
storm's end, and whether the rebuild
was still running at its end are printed, then replays after the rebuild.
Exits 1 on any wrong answer.

With ``--in-stock`` the sale still has ``--left`` units when Redis loses its
keys (the running gateway's, with nothing pending): replays of confirmed ids
(written ones and the first storm's) before, an in-stock storm of new buyers,
then the loss, the first purchase of a new buyer and a replay (their
latencies), the same storm during the rebuild (its rate against the first's,
p99, the loop's lag, replays sent during it), replays after the rebuild, and
last PostgreSQL's rows: no unit sold twice or made up, no buyer with two
orders, a row for every 201, and Redis agreeing with them.

    python -m loadtests.bench_memory_soldout [--orders 1000000] [--storm 60s]
    python -m loadtests.bench_memory_soldout --in-stock [--left 500000] ...
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from gateway.domain.model import Order
from gateway.domain.stock import StockLoad
from gateway.redis.connections import create_redis
from gateway.redis.layout import SkuKeys
from gateway.redis.reservations import Reservations
from gateway.settings import Settings
from loadtests.lib import wrk
from loadtests.lib.confirmed import write_confirmed
from loadtests.lib.cputime import cpu_seconds
from loadtests.lib.harness import Harness
from loadtests.lib.options import parse_seconds
from loadtests.lib.pinning import choose
from loadtests.lib.signals import signals_interrupt
from loadtests.lib.targets import Target
from testkit.http import http
from testkit.processes import stop_process

SKU = "bench-million"
# The stock the sale started with, as the admin API would have recorded it.
MOVEMENT = (
    "INSERT INTO stock_movements (sku, delta, reason, stock_after) VALUES ($1, $2, 'set', $2)"
)
REPLAYS = 200
# Replays sent during the storm that runs while the sale is rebuilt.
REPLAYS_DURING = 50
LOOP_LAG = "flashsale_event_loop_lag_seconds"
# The background build of a million ids' filter takes seconds, not minutes.
BUILD_WITHIN_S = 300.0
BUILD_POLL_S = 0.2
# How long the rebuild of the lost sale may take: a minute, and 200 us an order
# (a rebuild paced at a tenth of a busy loop's CPU; 3.5 minutes at 1,000,000).
REBUILD_BASE_S = 60.0
REBUILD_PER_ORDER_S = 0.0002


async def write_sale(
    database_url: str, redis_url: str, prefix: str, orders: int, left: int = 0
) -> list[Order]:
    """The order rows and the Redis keys a sale of ``orders`` units leaves, with
    ``left`` units still to sell (0: sold out)."""
    made = [
        Order(str(uuid.uuid4()), f"r{uuid.uuid4().hex}", SKU, f"user-{i:09d}", 1)
        for i in range(orders)
    ]
    con = await asyncpg.connect(database_url)
    try:
        await con.execute(
            "INSERT INTO inventory (sku, stock, per_user_limit) VALUES ($1, $2, 1)", SKU, left
        )
        await con.execute(MOVEMENT, SKU, orders + left)
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
        reservations = Reservations(redis, settings)
        await reservations.load_scripts()
        await write_confirmed(redis, settings, SKU, made)
        await reservations.load_stock(SKU, left, StockLoad.FRESH)
    finally:
        await redis.aclose()
    return made


def wait_built(target: Target, within: float = BUILD_WITHIN_S) -> float:
    """Wait until the gateway has built the sku's confirmed-id filter (in the
    background, after the first sold-out answer); the seconds the build took."""
    return wait_done(target, "flashsale_confirmed_id_build", within, "the confirmed-id filter")


def wait_done(target: Target, family: str, within: float, what: str) -> float:
    """Wait until the gateway's ``<family>s_total`` counts one, done in the
    background; its ``<family>_seconds_total`` then."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = target.scrape()
        if found.get(f"{family}s_total", 0) >= 1:
            return found.get(f"{family}_seconds_total", 0.0)
        time.sleep(BUILD_POLL_S)
    raise RuntimeError(f"{what} was not built within {within:g} s")


def rss_mib(target: Target) -> float:
    """The gateway's resident memory now."""
    return target.memory().get("VmRSS", 0) / 1024


def storm(
    target: Target, seconds: float, every: float, tag: str = "storm"
) -> tuple[list[float], dict[str, Any]]:
    """wrk on the sku for ``seconds``, every request a new buyer (``tag`` makes
    the run's ids its own); RSS samples taken meanwhile."""
    samples: list[float] = []
    result: dict[str, Any] = {}

    def load() -> None:
        result.update(
            wrk.run(target.url, sku=SKU, tag=tag, duration_s=seconds, threads=1, pinning=choose())
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
        lag_before = lag_buckets(gateway)
        samples, result = storm(gateway, storm_s, every)
        rps = result["requests"] / (result["duration_us"] / 1e6)
        lag = lag_quantiles(lag_before, lag_buckets(gateway))
        print(
            f"storm: {rps:,.0f} req/s for {storm_s:g} s, p99"
            f" {result['latency_us']['p99'] / 1000:.1f} ms, statuses {result['statuses']};"
            f" loop lag p99 <= {lag[0] * 1000:g} ms, max <= {lag[1] * 1000:g} ms"
        )
        print(f"RSS samples (MiB, every {every:g} s): {samples}")
        wrong = 0
        for order in random.Random(1).sample(made, min(REPLAYS, len(made))):
            body = {"sku": SKU, "user_id": order.user_id, "request_id": order.request_id}
            status, answer = http("POST", f"{gateway.url}/v1/purchase", body)
            wrong += status != 201 or answer.get("order_id") != order.order_id
        print(f"replays of {REPLAYS} confirmed ids: {REPLAYS - wrong} answered with their order")
        print(f"(measured {time.monotonic() - began:.0f} s after the mark; {pinning.describe()})")
        wrong += reload_after_loss(harness, gateway, database, prefix, made, storm_s, rps)
        return 1 if wrong else 0


def reload_after_loss(
    harness: Harness,
    gateway: Target,
    database: str,
    prefix: str,
    made: list[Order],
    storm_s: float,
    normal_rps: float,
) -> int:
    """Redis loses the sale's keys and a fresh gateway takes the next purchase,
    then a sold-out storm with replays while the sale is rebuilt in the
    background. Prints the figures; the number of wrong answers."""
    stop_process(gateway.process)
    asyncio.run(delete_sale_keys(harness.redis_url, prefix))
    fresh = harness.start_gateway(database)
    lag_before = lag_buckets(fresh)
    started = time.monotonic()
    status, body = http("POST", f"{fresh.url}/v1/purchase", {"sku": SKU, "user_id": "later"})
    took = time.monotonic() - started
    wrong = int((status, body) != (409, {"status": "sold_out"}))
    print(
        f"after Redis lost the sale: the first purchase answered {status} in {took * 1000:.1f} ms"
    )
    replays: list[int] = []
    thread = threading.Thread(target=lambda: replays.append(replay_all(fresh, made, 1)))
    thread.start()
    _, result = storm(fresh, storm_s, storm_s)
    thread.join()
    rebuilding = asyncio.run(still_rebuilding(harness.redis_url, prefix))
    rps = result["requests"] / (result["duration_us"] / 1e6)
    p99_ms = result["latency_us"]["p99"] / 1000
    lag = lag_quantiles(lag_before, lag_buckets(fresh))
    print(
        f"storm during the rebuild: {rps:,.0f} req/s ({rps / normal_rps:.2f}x the first storm),"
        f" p99 {p99_ms:.1f} ms, statuses {result['statuses']}; loop lag p99 <= {lag[0] * 1000:g}"
        f" ms, max <= {lag[1] * 1000:g} ms; rebuild still running at its end: {rebuilding}"
    )
    print(f"replays during it: {REPLAYS_DURING - replays[0]} of {REPLAYS_DURING} got their order")
    within = REBUILD_BASE_S + REBUILD_PER_ORDER_S * len(made)
    rebuilt_s = wait_done(fresh, "flashsale_sale_rebuild", within, "the sale's hashes")
    print(f"rebuild done: {rebuilt_s:.1f} s in the background; RSS then {rss_mib(fresh):.1f} MiB")
    after = replay_all(fresh, made, 2)
    print(f"replays after it: {REPLAYS_DURING - after} of {REPLAYS_DURING} got their order")
    return wrong + replays[0] + after


def replay_all(target: Target, made: list[Order], seed: int) -> int:
    """Replay a sample of confirmed request ids; how many did not get their order."""
    return replay(target, random.Random(seed).sample(made, min(REPLAYS_DURING, len(made))))


def replay(target: Target, orders: Sequence[Order]) -> int:
    """Replay confirmed request ids one after another; how many did not get their order."""
    wrong = 0
    for order in orders:
        body = {"sku": SKU, "user_id": order.user_id, "request_id": order.request_id}
        status, answer = http("POST", f"{target.url}/v1/purchase", body, timeout=30.0)
        wrong += status != 201 or answer.get("order_id") != order.order_id
    return wrong


def timed_purchase(target: Target, user_id: str, request_id: str) -> tuple[int, Any, float]:
    """One purchase: its status, body and latency in ms (through the tool's client)."""
    body = {"sku": SKU, "user_id": user_id, "request_id": request_id}
    started = time.monotonic()
    status, answer = http("POST", f"{target.url}/v1/purchase", body, timeout=30.0)
    return status, answer, (time.monotonic() - started) * 1000


def run_in_stock(orders: int, left: int, storm_s: float) -> int:
    """A sale of ``orders`` orders with ``left`` units to sell loses its Redis
    keys under a running gateway: set up, measure, print; the exit status."""
    pinning = choose()
    with signals_interrupt(), Harness(pinning=pinning) as harness:
        database = harness.database("million")
        prefix = f"{harness.key_prefix}:gateway"
        print(f"writing a sale of {orders:,} orders with {left:,} units left ...", flush=True)
        made = asyncio.run(write_sale(database, harness.redis_url, prefix, orders, left))
        gateway = harness.start_gateway(database)
        status, _, idle_ms = timed_purchase(gateway, "idle-new", "idle-new")
        print(f"a new buyer on the idle gateway, before the loss: {status} in {idle_ms:.1f} ms")
        wrong = int(status != 201)
        lag_before = lag_buckets(gateway)
        _, before = storm(gateway, storm_s, storm_s, tag="before")
        lag = lag_quantiles(lag_before, lag_buckets(gateway))
        rps = before["requests"] / (before["duration_us"] / 1e6)
        print(
            f"in-stock storm before the loss: {rps:,.0f} req/s for {storm_s:g} s, p99"
            f" {before['latency_us']['p99'] / 1000:.1f} ms, statuses {before['statuses']};"
            f" loop lag p99 <= {lag[0] * 1000:g} ms, max <= {lag[1] * 1000:g} ms"
        )
        # Half written before the tool ran, half made by the gateway in the storm.
        sample = random.Random(1).sample(made, min(REPLAYS_DURING, len(made)) // 2)
        sample += asyncio.run(storm_orders(database, "rbefore-%", len(sample)))
        replayed = replay(gateway, sample)
        print(f"replays before the loss: {len(sample) - replayed} of {len(sample)} got their order")
        print(f"({pinning.describe()})")
        sold = int(status == 201) + int(before["statuses"].get("201", 0))
        after, wrong_after = in_stock_after_loss(
            harness, gateway, prefix, sample, orders, storm_s, rps
        )
        answered = sold + after
        checks = asyncio.run(
            check_rows(database, harness.redis_url, prefix, orders, left, answered)
        )
        wrong += replayed + wrong_after + checks
        return 1 if wrong else 0


def in_stock_after_loss(
    harness: Harness,
    gateway: Target,
    prefix: str,
    sample: list[Order],
    orders: int,
    storm_s: float,
    normal_rps: float,
) -> tuple[int, int]:
    """Redis loses the sale's keys; a new buyer, a replay, then the in-stock storm
    with replays while the sale is rebuilt, replays after it. Prints the
    figures; the 201s answered to new buyers and the number of wrong answers."""
    asyncio.run(delete_sale_keys(harness.redis_url, prefix))
    lag_before = lag_buckets(gateway)
    status, _, first_ms = timed_purchase(gateway, "loss-new", "loss-new")
    order = sample[0]
    replayed, answer, replay_ms = timed_purchase(gateway, order.user_id, order.request_id)
    wrong = int(status != 201) + int(replayed != 201 or answer.get("order_id") != order.order_id)
    print(
        f"after Redis lost the sale: a new buyer answered {status} in {first_ms:.1f} ms,"
        f" a replay {replayed} in {replay_ms:.1f} ms"
    )
    during: list[int] = []
    thread = threading.Thread(target=lambda: during.append(replay(gateway, sample)))
    thread.start()
    _, result = storm(gateway, storm_s, storm_s, tag="during")
    thread.join()
    rebuilding = asyncio.run(still_rebuilding(harness.redis_url, prefix))
    rps = result["requests"] / (result["duration_us"] / 1e6)
    lag = lag_quantiles(lag_before, lag_buckets(gateway))
    print(
        f"in-stock storm during the rebuild: {rps:,.0f} req/s ({rps / normal_rps:.2f}x the"
        f" first), p99 {result['latency_us']['p99'] / 1000:.1f} ms, statuses"
        f" {result['statuses']}; loop lag p99 <= {lag[0] * 1000:g} ms, max <="
        f" {lag[1] * 1000:g} ms; rebuild still running at its end: {rebuilding}"
    )
    print(f"replays during it: {len(sample) - during[0]} of {len(sample)} got their order")
    within = REBUILD_BASE_S + REBUILD_PER_ORDER_S * orders
    rebuilt_s = wait_done(gateway, "flashsale_sale_rebuild", within, "the sale's hashes")
    after = replay(gateway, sample)
    print(
        f"rebuild done: {rebuilt_s:.1f} s; replays after it: {len(sample) - after} got their order"
    )
    sold = int(status == 201) + int(result["statuses"].get("201", 0))
    return sold, wrong + during[0] + after


async def storm_orders(database_url: str, pattern: str, count: int) -> list[Order]:
    """A random sample of the orders a storm's request ids (``pattern``) made."""
    con = await asyncpg.connect(database_url)
    try:
        rows = await con.fetch(
            "SELECT order_id::text, request_id, sku, user_id, qty FROM orders"
            " WHERE sku = $1 AND request_id LIKE $2 ORDER BY random() LIMIT $3",
            SKU,
            pattern,
            count,
        )
    finally:
        await con.close()
    return [Order(*row) for row in rows]


async def check_rows(
    database_url: str, redis_url: str, prefix: str, orders: int, left: int, answered: int
) -> int:
    """PostgreSQL's rows at the end: no unit sold beyond the sale's or lost, no
    buyer with two orders, at least one row for each 201 answered to a new buyer
    (a request wrk gave up on may have committed too), and Redis's hashes and
    counter agreeing. Prints them; how many of those checks failed."""
    con = await asyncpg.connect(database_url)
    try:
        row = await con.fetchrow(
            "SELECT count(*), count(DISTINCT user_id), coalesce(sum(qty), 0)"
            " FROM orders WHERE sku = $1",
            SKU,
        )
        assert row is not None  # an aggregate has one row
        rows, buyers, units = row
        stock = await con.fetchval("SELECT stock FROM inventory WHERE sku = $1", SKU)
    finally:
        await con.close()
    redis = create_redis(Settings(redis_url=redis_url, key_prefix=prefix))
    try:
        keys = SkuKeys.of(prefix, SKU)
        done, held = await redis.hlen(keys.done), await redis.hlen(keys.buyers)
        counter = int(await redis.get(keys.stock) or -1)
    finally:
        await redis.aclose()
    checks = {
        "no oversell (units sold + stock = the sale's, stock >= 0)": (
            units + stock == orders + left and stock >= 0
        ),
        "no buyer with two orders": buyers == rows,
        "a row for every 201": rows - orders >= answered,
        "Redis agrees (done = buyers = rows, counter = stock)": (
            done == held == rows and counter == stock
        ),
    }
    print(
        f"PostgreSQL at the end: {rows:,} orders of {buyers:,} buyers, {units:,} units sold,"
        f" stock {stock:,} (the sale: {orders + left:,}); {answered:,} new buyers answered 201,"
        f" {rows - orders:,} rows made; Redis done {done:,}, buyers {held:,}, counter {counter:,}"
    )
    for name, held_ok in checks.items():
        print(f"  {name}: {'held' if held_ok else 'FAILED'}")
    return sum(not ok for ok in checks.values())


def lag_buckets(target: Target) -> dict[float, float]:
    """The loop-lag histogram's cumulative buckets now (upper bound -> count)."""
    _, text = http("GET", f"{target.url}/metrics")
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(str(text)):
        for sample in family.samples:
            if sample.name == f"{LOOP_LAG}_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return buckets


def lag_quantiles(before: dict[float, float], after: dict[float, float]) -> tuple[float, float]:
    """The bucket bounds holding the p99 and the largest lag between two scrapes."""
    delta = sorted((bound, after[bound] - before.get(bound, 0.0)) for bound in after)
    total = delta[-1][1] if delta else 0.0
    p99 = next((b for b, n in delta if n >= 0.99 * total), float("inf"))
    most = next((b for b, n in delta if n >= total), float("inf"))
    return p99, most


async def still_rebuilding(redis_url: str, prefix: str) -> bool:
    """Whether the sku's rebuild flag is still set."""
    redis = create_redis(Settings(redis_url=redis_url, key_prefix=prefix))
    try:
        return bool(await redis.exists(SkuKeys.of(prefix, SKU).rebuild))
    finally:
        await redis.aclose()


async def delete_sale_keys(redis_url: str, prefix: str) -> None:
    """Delete the sku's keys, as a Redis restart without persistence would."""
    redis = create_redis(Settings(redis_url=redis_url, key_prefix=prefix))
    try:
        keys = SkuKeys.of(prefix, SKU)
        await redis.delete(*keys.all(), keys.rebuild)
    finally:
        await redis.aclose()


def main() -> None:
    """Parse the command line and run."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--storm", default="60s")
    parser.add_argument("--every", default="5s")
    parser.add_argument(
        "--in-stock", action="store_true", help="the sale still in stock when Redis loses it"
    )
    parser.add_argument("--left", type=int, default=500_000, help="units left, with --in-stock")
    args = parser.parse_args()
    if args.in_stock:
        sys.exit(run_in_stock(args.orders, args.left, parse_seconds(args.storm)))
    sys.exit(run(args.orders, parse_seconds(args.storm), parse_seconds(args.every)))


if __name__ == "__main__":
    main()
