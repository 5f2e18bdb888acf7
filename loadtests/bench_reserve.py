"""Micro-benchmark of the reservation step alone: N reservations of one sku as N
single-entry reserve.lua calls in one pipeline (the shape before issue 14) or
as one reserve.lua call carrying all N (reserve-many, the shape now).

``python -m loadtests.bench_reserve`` against ``BENCH_REDIS_URL`` (default the
local Redis), under a key prefix of its own that it deletes at the end. Each
round times both shapes for every batch size, in rotating order (the machine is
shared: interleaving spreads the noise over both); the table shows the median
and the range of reservations per second, client and server together, over
``BENCH_ROUNDS`` rounds of ``BENCH_DURATION`` seconds per shape and size.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from gateway.domain.model import Purchase, SkuInfo
from gateway.redis.layout import SkuKeys
from gateway.redis.reservations import ReserveCalls, ReserveEntry
from gateway.redis.scripts import Script, ScriptArg, read_script
from gateway.settings import Settings

BATCH_SIZES = (1, 16, 64, 256)
# A stock no run drains; a day's retention, no window, no rate limits.
STOCK = 10**12
HEAD: tuple[ScriptArg, ...] = (86_400_000, "", "", 0, 0, 0, 0)

Shape = Callable[[Redis, Script, ReserveCalls, list[Purchase]], Awaitable[None]]


def _entries(batch: list[Purchase]) -> list[ReserveEntry]:
    """The gateway's entries for ``batch``: no buckets, nothing to verify."""
    return [ReserveEntry(p, "", "", HEAD, SkuInfo(p.sku, 1), False) for p in batch]


async def pipelined(
    redis: Redis, script: Script, calls: ReserveCalls, batch: list[Purchase]
) -> None:
    """One single-entry call per reservation, all in one pipeline."""
    pipe = redis.pipeline(transaction=False)
    for entry in _entries(batch):
        keys, args = calls.reserve([entry])
        pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    replies = await pipe.execute()
    assert all(reply[0][0] == b"ok" for reply in replies), replies[:3]


async def many(redis: Redis, script: Script, calls: ReserveCalls, batch: list[Purchase]) -> None:
    """One call carrying every reservation."""
    keys, args = calls.reserve(_entries(batch))
    replies = await redis.evalsha(script.sha, len(keys), *keys, *args)
    assert all(reply[0] == b"ok" for reply in replies), replies[:3]


SHAPES: dict[str, Shape] = {"pipelined": pipelined, "many": many}


async def rate(
    redis: Redis,
    script: Script,
    calls: ReserveCalls,
    sku: str,
    shape: Shape,
    size: int,
    seconds: float,
) -> float:
    """Reservations per second of ``shape`` in batches of ``size`` for ``seconds``."""
    counter = itertools.count()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        batch = [Purchase(sku, f"u{n}", 1, f"r{n}") for n in itertools.islice(counter, size)]
        await shape(redis, script, calls, batch)
        done += size
    return done / (time.perf_counter() - started)


async def main() -> None:
    """Run the rounds and print the table."""
    redis = Redis.from_url(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    rounds = int(os.environ.get("BENCH_ROUNDS", "5"))
    seconds = float(os.environ.get("BENCH_DURATION", "1"))
    prefix = f"benchreserve{uuid.uuid4().hex[:8]}"
    script = read_script("reserve")
    await script.load(redis)
    # The gateway's own builder of KEYS and ARGV, so the bench speaks the
    # script's current contract (a copy of it here fell behind once).
    calls = ReserveCalls(Settings(key_prefix=prefix))
    results: dict[tuple[str, int], list[float]] = {}
    try:
        for n in range(rounds):
            order = list(SHAPES) if n % 2 == 0 else list(reversed(SHAPES))
            for size in BATCH_SIZES:
                for name in order:
                    # A fresh sku per run: ledgers of earlier runs do not weigh on it.
                    sku = f"{name}-{size}-{n}"
                    keys = SkuKeys.of(prefix, sku)
                    await redis.set(keys.stock, STOCK)
                    found = await rate(redis, script, calls, sku, SHAPES[name], size, seconds)
                    results.setdefault((name, size), []).append(found)
                    async for key in redis.scan_iter(match=f"{prefix}:{{{sku}}}*", count=1000):
                        await redis.delete(key)
    finally:
        async for key in redis.scan_iter(match=f"{prefix}*", count=1000):
            await redis.delete(key)
        await redis.aclose()
    print(f"reservations/s, median (min-max) of {rounds} interleaved rounds of {seconds:g} s")
    print(f"{'batch':>6} {'pipelined':>24} {'many':>24} {'many/pipelined':>15}")
    for size in BATCH_SIZES:
        cells = []
        for name in SHAPES:
            values = results[(name, size)]
            cells.append(
                f"{statistics.median(values):>9,.0f} ({min(values):,.0f}-{max(values):,.0f})"
            )
        ratio = statistics.median(results[("many", size)]) / statistics.median(
            results[("pipelined", size)]
        )
        print(f"{size:>6} {cells[0]:>24} {cells[1]:>24} {ratio:>14.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
