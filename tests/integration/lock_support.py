"""Helpers for the lock tests: worker processes and the lock backends under test.

Nothing here is a fixture: each test module builds its fixtures from these.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from gateway.lock import (
    LockSubscriber,
    PgAdvisoryLock,
    RedisLock,
    advisory_key,
    create_fence_sequence,
)
from gateway.lock.zk_session import ZkSession
from gateway.lock.zookeeper import ROOT as ZK_ROOT
from gateway.lock.zookeeper import ZooKeeperLock

ROOT = Path(__file__).resolve().parents[2]

AnyLock = RedisLock | PgAdvisoryLock | ZooKeeperLock


# --------------------------------------------------------------------- worker processes


class Worker:
    """A ``python -m tests.integration.lock_worker`` process whose stdout we read by line."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr: Path) -> None:
        self.proc = proc
        self._stderr = stderr

    @classmethod
    async def start(cls, args: Sequence[str], stderr: Path) -> Worker:
        """Start a worker with ``args`` (see lock_worker.py); its stderr goes to a file."""
        with stderr.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.integration.lock_worker",
                *args,
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        return cls(proc, stderr)

    async def line(self, within: float = 10.0) -> str:
        """The next line the worker prints, within ``within`` seconds."""
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), within)
        if not raw:
            raise AssertionError(f"worker ended early; stderr:\n{self._stderr.read_text()}")
        return raw.decode().strip()

    async def expect(self, word: str, within: float = 10.0) -> list[str]:
        """Read lines until one starts with ``word``; returns its fields."""
        deadline = time.monotonic() + within
        while True:
            fields = (await self.line(max(deadline - time.monotonic(), 0.001))).split()
            if fields and fields[0] == word:
                return fields

    async def lines_until(self, word: str, within: float = 10.0) -> list[list[str]]:
        """Every line up to and including the first that starts with ``word``, split."""
        deadline = time.monotonic() + within
        seen: list[list[str]] = []
        while not seen or seen[-1][:1] != [word]:
            seen.append((await self.line(max(deadline - time.monotonic(), 0.001))).split())
        return seen

    async def send(self, text: str) -> None:
        """Write a line to the worker's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        await self.proc.stdin.drain()

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the worker."""
        self.proc.send_signal(sig)

    async def stop(self) -> None:
        """Kill the worker (if it still runs) and reap it."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)  # a stopped process must wake to die
                self.proc.kill()
        await asyncio.wait_for(self.proc.wait(), 10)


@contextlib.asynccontextmanager
async def workers(*arg_lists: Sequence[str], tmp: Path) -> AsyncIterator[list[Worker]]:
    """Start one worker per argument list; all are killed when the block ends."""
    started: list[Worker] = []
    try:
        for i, args in enumerate(arg_lists):
            started.append(await Worker.start(args, tmp / f"worker{i}.err"))
        yield started
    finally:
        for worker in started:
            await worker.stop()


# ------------------------------------------------------------------------ backends


class Subscribers:
    """The one unlock subscriber of each Redis client a test uses (as an application
    would share one per client), all closed when the test ends."""

    def __init__(self) -> None:
        self._made: dict[int, LockSubscriber] = {}

    def of(self, client: Redis) -> LockSubscriber:
        """The subscriber of ``client``, made on first use."""
        made = self._made.get(id(client))
        if made is None:
            made = self._made[id(client)] = LockSubscriber(client)
        return made

    def lock(self, client: Redis, name: str, **kwargs: Any) -> RedisLock:
        """A Redis lock on ``client`` that waits through the client's subscriber."""
        return RedisLock(client, name, subscriber=self.of(client), **kwargs)

    async def aclose(self) -> None:
        """Close every subscriber made."""
        for made in self._made.values():
            await made.aclose()


async def open_pg_pool(database_url: str, max_size: int = 12) -> asyncpg.Pool[Any]:
    """A pool on the session database, with the lock package's fence sequence."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=max_size)
    async with pool.acquire() as con:
        await create_fence_sequence(con)
    return pool


async def close_pg_pool(pool: asyncpg.Pool[Any]) -> None:
    """Close the pool, terminating it if a connection is still out after 5 s."""
    try:
        await asyncio.wait_for(pool.close(), 5)
    except TimeoutError:
        pool.terminate()


@dataclass
class Backend:
    """One lock backend under test and ways to look at its lock from outside."""

    kind: str
    redis: Redis | RedisCluster
    pool: asyncpg.Pool[Any] | None
    name: str
    # The one unlock subscriber every Redis lock of the test shares.
    subscriber: LockSubscriber
    # The ZooKeeper session every ZooKeeper lock of the test shares (that family only).
    zookeeper: ZkSession | None = None

    def new(self, **kwargs: Any) -> AnyLock:
        """A new lock object on the test's lock name."""
        if self.zookeeper is not None:
            return ZooKeeperLock(self.zookeeper, self.name, **kwargs)
        if self.pool is not None:
            return PgAdvisoryLock(self.pool, self.name, **kwargs)
        return RedisLock(self.redis, self.name, subscriber=self.subscriber, **kwargs)

    async def is_free(self) -> bool:
        """Whether a fresh lock object can take the lock right now (it gives it back)."""
        probe = self.new()
        if not await probe.acquire(wait=0):
            return False
        await probe.release()
        return True

    async def snapshot(self) -> Any:
        """The backend's view of the lock, to compare before and after."""
        if self.zookeeper is not None:
            return sorted(await self.zookeeper.children(self._zk_path))
        if self.pool is None:
            return await self.redis.hgetall(self.name)
        return [tuple(r) for r in await self.pool.fetch(_PG_LOCKS, *_pg_key_parts(self.name))]

    async def waiting(self) -> int:
        """How many acquisitions wait in this process (Redis) or in the server (PostgreSQL,
        ZooKeeper: the nodes behind the holder's)."""
        if self.zookeeper is not None:
            return max(len(await self.zookeeper.children(self._zk_path)) - 1, 0)
        if self.pool is None:
            return self.subscriber.waiting
        rows = await self.pool.fetch(_PG_LOCKS, *_pg_key_parts(self.name))
        return sum(1 for r in rows if not r["granted"])

    async def waiting_is(self, count: int) -> bool:
        """Whether exactly ``count`` acquisitions wait (a condition to wait for)."""
        return await self.waiting() == count

    async def break_lock(self) -> None:
        """Take the lock away from its holder behind its back."""
        if self.zookeeper is not None:
            for child in await self.zookeeper.children(self._zk_path):
                await self.zookeeper.delete(f"{self._zk_path}/{child}")
            return
        if self.pool is None:
            await self.redis.delete(self.name)
            return
        rows = await self.pool.fetch(_PG_LOCKS, *_pg_key_parts(self.name))
        for row in rows:
            if row["granted"]:
                await self.pool.execute("SELECT pg_terminate_backend($1)", row["pid"])

    @property
    def _zk_path(self) -> str:
        return f"{ZK_ROOT}/{self.name}"


_PG_LOCKS = """
SELECT pid, granted FROM pg_locks
WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 1
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY granted DESC, pid
"""


def _pg_key_parts(name: str) -> tuple[int, int]:
    """pg_locks shows a bigint advisory key as (classid, objid): its high and low halves."""
    key = advisory_key(name) & 0xFFFFFFFFFFFFFFFF
    return key >> 32, key & 0xFFFFFFFF
