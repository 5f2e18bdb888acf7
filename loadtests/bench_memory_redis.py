"""Redis memory per confirmed order: what a sale of N orders keeps in Redis.

Writes N confirmed orders of one sku the way the gateway does after a sale
(``loadtests.lib.confirmed``: the done and buyers hashes, with request ids,
user ids and order ids shaped as the API makes them), reads ``MEMORY USAGE``
of every key of the sku, and prints bytes per order for each N, plus the
projection to 1,000,000 orders. Keys live under a private prefix and are
deleted afterwards.

    python -m loadtests.bench_memory_redis [--orders 10000,100000,200000]
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from collections.abc import Sequence

from gateway.domain.model import Order
from gateway.domain.stock import StockLoad
from gateway.redis.connections import create_redis
from gateway.redis.layout import SkuKeys
from gateway.redis.reservations import Reservations
from gateway.settings import Settings
from loadtests.lib.confirmed import write_confirmed

PROJECTED = 1_000_000


async def measure(redis_url: str, orders: int) -> dict[str, int]:
    """Bytes each key of a sku with ``orders`` confirmed orders takes in Redis."""
    prefix = f"memtest{uuid.uuid4().hex[:8]}"
    settings = Settings(redis_url=redis_url, key_prefix=prefix)
    redis = create_redis(settings)
    reservations = Reservations(redis, settings)
    sku = "phone"
    keys = SkuKeys.of(prefix, sku)
    try:
        made = [
            Order(str(uuid.uuid4()), f"r{uuid.uuid4().hex}", sku, f"user-{i:09d}", 1)
            for i in range(orders)
        ]
        await write_confirmed(redis, settings, sku, made)
        await reservations.load_stock(sku, 0, StockLoad.FRESH)
        sizes = {}
        for name, key in zip(("stock", "buyers", "pending", "done"), keys.all(), strict=True):
            sizes[name] = int(await redis.memory_usage(key, samples=0) or 0)
        return sizes
    finally:
        await redis.delete(*keys.all())
        await redis.aclose()


async def main(redis_url: str, counts: Sequence[int]) -> None:
    """Print one line per order count, then the projection."""
    per_order = 0.0
    print(f"{'orders':>10} {'done B':>12} {'buyers B':>12} {'total B':>12} {'B/order':>8}")
    for count in counts:
        sizes = await measure(redis_url, count)
        total = sum(sizes.values())
        per_order = total / count
        print(
            f"{count:>10,} {sizes['done']:>12,} {sizes['buyers']:>12,} {total:>12,}"
            f" {per_order:>8.1f}"
        )
    print(f"projected for {PROJECTED:,} orders: {per_order * PROJECTED / 2**20:,.0f} MiB")


def cli() -> None:
    """Parse the command line and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--orders", default="10000,100000,200000")
    args = parser.parse_args()
    counts = [int(part) for part in args.orders.split(",")]
    asyncio.run(main(args.redis_url, counts))


if __name__ == "__main__":
    cli()
