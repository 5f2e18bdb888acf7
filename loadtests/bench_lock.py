"""Lock benchmark: our locks beside redis-py's ``redis.asyncio.lock.Lock``, same Redis, same run.

    python -m loadtests.bench_lock [--redis-url URL] [--pg-dsn DSN] [--uvloop]

Two measures per lock:

* uncontended: one task acquires and releases one lock in a loop: pairs per second and
  client CPU per pair (best of 3 interleaved rounds);
* hand-off: two tasks, each with its own lock object on one name, take turns; the
  latency is from a holder's release call to the moment the other task's acquire,
  waiting for 5-105 ms by then, returns (p50 and p99 of 100 hand-offs).

redis-py's lock waits by polling every ``sleep`` seconds (0.1 by default); ours is
woken by the unlock message. ``--pg-dsn`` adds PgAdvisoryLock (it creates the
sequence ``lock_fence_seq`` in that database if missing, with
``create_fence_sequence``). Keys live under ``bench:{lock-...}`` and are deleted
afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from redis.asyncio import Redis

from gateway.lock import LockSubscriber, PgAdvisoryLock, RedisLock, create_fence_sequence

UNCONTENDED_OPS = 1000
ROUNDS = 3
HANDOFFS = 100
WAITING_S = (0.005, 0.105)  # how long the next holder waits before each release


@dataclass
class Contender:
    """One lock under test: how to make a lock object and take/give it back."""

    label: str
    make: Callable[[str], Any]
    acquire: Callable[[Any], Awaitable[Any]]
    release: Callable[[Any], Awaitable[Any]]


@dataclass
class Result:
    """The figures of one contender."""

    label: str
    ops_per_s: float
    cpu_us: float
    p50_ms: float
    p99_ms: float


async def uncontended(c: Contender, name: str) -> tuple[float, float]:
    """Acquire+release pairs per second, and client CPU microseconds per pair; one task,
    no competition."""
    lock = c.make(name)
    for _ in range(50):  # warm up: scripts loaded, connections open
        await c.acquire(lock)
        await c.release(lock)
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(UNCONTENDED_OPS):
        await c.acquire(lock)
        await c.release(lock)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return UNCONTENDED_OPS / elapsed, cpu / UNCONTENDED_OPS * 1e6


async def handoff(c: Contender, name: str) -> list[float]:
    """Latencies (s) from a release to the waiting task's acquire returning.

    Two tasks play ping-pong: the holder tells the other to start acquiring, lets it
    wait a random 5-105 ms (so it is parked in its wait, not making a first attempt,
    and a poller's phase varies), then releases. Acquire and release happen in the
    same task, as ownership requires.
    """
    pauses = random.Random(7)
    latencies: list[float] = []
    turn = [asyncio.Event(), asyncio.Event()]
    released_at = 0.0

    async def play(me: int) -> None:
        nonlocal released_at
        lock = c.make(name)
        for _ in range(HANDOFFS // 2):
            await turn[me].wait()
            turn[me].clear()
            await c.acquire(lock)
            if released_at:
                latencies.append(time.perf_counter() - released_at)
            turn[1 - me].set()
            await asyncio.sleep(pauses.uniform(*WAITING_S))
            released_at = time.perf_counter()
            await c.release(lock)

    turn[0].set()
    await asyncio.gather(play(0), play(1))
    return latencies


def contenders(
    redis: Redis, subscriber: LockSubscriber, pool: asyncpg.Pool[Any] | None
) -> list[Contender]:
    """Our locks and redis-py's, built the same way."""

    async def ours_acquire(lock: Any) -> None:
        await lock.acquire()

    async def ours_release(lock: Any) -> None:
        await lock.release()

    async def redispy_acquire(lock: Any) -> None:
        await lock.acquire()

    async def redispy_release(lock: Any) -> None:
        await lock.release()

    found = [
        Contender(
            "RedisLock (gateway.lock)",
            lambda n: RedisLock(redis, n, lease=30, subscriber=subscriber),
            ours_acquire,
            ours_release,
        ),
        Contender(
            "redis-py Lock, sleep=0.1 (default)",
            lambda n: redis.lock(n, timeout=30, thread_local=False),
            redispy_acquire,
            redispy_release,
        ),
        Contender(
            "redis-py Lock, sleep=0.01",
            lambda n: redis.lock(n, timeout=30, sleep=0.01, thread_local=False),
            redispy_acquire,
            redispy_release,
        ),
    ]
    if pool is not None:
        found.append(
            Contender(
                "PgAdvisoryLock (gateway.lock)",
                lambda n: PgAdvisoryLock(pool, n, lease=30),
                ours_acquire,
                ours_release,
            )
        )
    return found


async def run(redis_url: str, pg_dsn: str | None) -> list[Result]:
    """Measure every contender, each on lock names of its own. The uncontended loop runs
    in interleaved rounds and keeps each contender's best, to damp a busy machine."""
    redis = Redis.from_url(redis_url)
    subscriber = LockSubscriber(redis)
    pool = None
    if pg_dsn:
        pool = await asyncpg.create_pool(pg_dsn, min_size=2, max_size=4)
        async with pool.acquire() as con:
            await create_fence_sequence(con)
    prefix = f"bench:{{lock-{uuid.uuid4().hex[:8]}}}"
    try:
        found = contenders(redis, subscriber, pool)
        best = [(0.0, float("inf"))] * len(found)
        for _ in range(ROUNDS):
            for i, c in enumerate(found):
                ops, cpu = await uncontended(c, f"{prefix}:u{i}")
                best[i] = (max(best[i][0], ops), min(best[i][1], cpu))
        results = []
        for i, c in enumerate(found):
            lat = sorted(await handoff(c, f"{prefix}:h{i}"))
            p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
            ops, cpu = best[i]
            results.append(Result(c.label, ops, cpu, statistics.median(lat) * 1000, p99 * 1000))
    finally:
        async for key in redis.scan_iter(match=f"{prefix}*"):
            await redis.delete(key)
        await subscriber.aclose()
        await redis.aclose()
        if pool is not None:
            await pool.close()
    return results


def table(results: Sequence[Result]) -> str:
    """The results as a small fixed-width table."""
    head = f"{'lock':<36}{'acq+rel/s':>10}{'CPU us/op':>11}{'hand-off p50 ms':>17}{'p99 ms':>9}"
    rows = [
        f"{r.label:<36}{r.ops_per_s:>10,.0f}{r.cpu_us:>11.0f}{r.p50_ms:>17.2f}{r.p99_ms:>9.2f}"
        for r in results
    ]
    return "\n".join([head, "-" * len(head), *rows])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench_lock", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--pg-dsn", default=None, help="also measure PgAdvisoryLock")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")
    args = parser.parse_args(argv)
    if args.uvloop:
        import uvloop

        uvloop.install()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    loop = "uvloop" if args.uvloop else "asyncio"
    print(f"{os.cpu_count()} CPUs, load average {load}; event loop: {loop}")
    print(table(asyncio.run(run(args.redis_url, args.pg_dsn))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
