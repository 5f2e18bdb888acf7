"""A lock-holding process for the multi-process lock tests.

    python -m tests.integration.lock_worker MODE --backend redis|postgres|zookeeper
        --redis-url URL --dsn DSN --name LOCK [--zookeeper HOSTS] [mode options]

With ``--backend zookeeper`` the process opens its own ZooKeeper session whose
timeout is the lease, as the gateway does.

Modes (each prints one word per event on stdout, one line at a time):

``count``  READY, waits for a line on stdin, then ``--tasks`` tasks each take the lock
           ``--rounds`` times and do a non-atomic GET/SET increment of ``--counter``,
           appending their fence to the list ``--log``; prints DONE.
``hold``   takes the lock with ``--lease``, prints ``ACQUIRED <fence>``, holds forever.
``stale``  takes the lock with ``--lease``, prints ``ACQUIRED <fence>``, then
           writes ``A`` under its fence to row 1 of ``--table`` every 50 ms, printing
           ``WROTE <rows>``, until the lock is lost: ``LOCKLOST <lost event set>``.
           Then it writes once more with its stale fence and prints ``LATE <rows>``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import asyncpg
from redis.asyncio import Redis

from gateway.lock import LockLost, LockSubscriber, PgAdvisoryLock, RedisLock
from gateway.lock.zk_session import ZkSession
from gateway.lock.zookeeper import ZooKeeperLock

AnyLock = RedisLock | PgAdvisoryLock | ZooKeeperLock

FENCED_WRITE = "UPDATE {table} SET value = $1, fence = $2 WHERE id = 1 AND fence <= $2"


def say(*words: object) -> None:
    print(*words, flush=True)


async def fenced_write(pool: asyncpg.Pool[Any], table: str, value: str, fence: int) -> int:
    """Write ``value`` unless a newer fence has written already; the rows updated."""
    status = await pool.execute(FENCED_WRITE.format(table=table), value, fence)
    return int(status.split()[-1])


async def count(args: argparse.Namespace, lock: AnyLock, redis: Redis) -> None:
    say("READY")
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    async def one_task() -> None:
        for _ in range(args.rounds):
            async with lock:
                value = int(await redis.get(args.counter) or 0)
                await asyncio.sleep(0)  # let the other tasks run between the read and the write
                await redis.set(args.counter, value + 1)
                await redis.rpush(args.log, lock.fence)

    # One lock object shared by every task: ownership is per task, not per object.
    await asyncio.gather(*(one_task() for _ in range(args.tasks)))
    say("DONE")


async def hold(lock: AnyLock) -> None:
    await lock.acquire()
    say("ACQUIRED", lock.fence)
    await asyncio.Event().wait()


async def stale(args: argparse.Namespace, lock: AnyLock) -> None:
    pool = await asyncpg.create_pool(args.dsn, min_size=1, max_size=2)
    fence = 0
    try:
        async with lock:
            fence = lock.fence
            say("ACQUIRED", fence)
            while True:
                say("WROTE", await fenced_write(pool, args.table, "A", fence))
                await asyncio.sleep(0.05)
    except LockLost:
        say("LOCKLOST", int(lock.lost.is_set()))
    # A holder that ignores the signal, as if this write had already been in flight.
    say("LATE", await fenced_write(pool, args.table, "A-late", fence))
    await pool.close()


async def main(args: argparse.Namespace) -> None:
    redis = Redis.from_url(args.redis_url)
    pool = None
    zookeeper = None
    lock: AnyLock
    if args.backend == "postgres":
        pool = await asyncpg.create_pool(args.dsn, min_size=1, max_size=4)
        lock = PgAdvisoryLock(pool, args.name, lease=args.lease)
    elif args.backend == "zookeeper":
        zookeeper = ZkSession(args.zookeeper, session_timeout=args.lease)
        await zookeeper.start(wait=10)
        lock = ZooKeeperLock(zookeeper, args.name, lease=args.lease)
    else:
        lock = RedisLock(redis, args.name, lease=args.lease, subscriber=LockSubscriber(redis))
    if args.mode == "count":
        await count(args, lock, redis)
    elif args.mode == "hold":
        await hold(lock)
    else:
        await stale(args, lock)
    if pool is not None:
        await pool.close()
    if zookeeper is not None:
        await zookeeper.stop()
    await redis.aclose()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lock_worker")
    parser.add_argument("mode", choices=("count", "hold", "stale"))
    parser.add_argument("--backend", choices=("redis", "postgres", "zookeeper"), default="redis")
    parser.add_argument("--zookeeper", default="", help="host:port,... (zookeeper backend)")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--lease", type=float, default=5.0)
    parser.add_argument("--counter", default="")
    parser.add_argument("--log", default="")
    parser.add_argument("--table", default="")
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
