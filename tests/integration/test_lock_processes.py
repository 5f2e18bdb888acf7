"""The lock across OS processes: mutual exclusion, a killed holder, and a stopped
holder that wakes up after its lease (ZooKeeper: its session expired) and is fenced
out by PostgreSQL."""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis

from gateway.lock import LockSubscriber, RedisLock
from gateway.redis.layout import lock_key
from testkit.polling import wait_for
from testkit.services import REDIS_URL
from testkit.zookeeper_servers import ZooKeeperServer
from tests.integration.lock_support import (
    AnyLock,
    Backend,
    workers,
)
from tests.integration.lock_worker import fenced_write

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["redis", "postgres", "zookeeper"])
def backend_kind(request: pytest.FixtureRequest) -> tuple[str, ZooKeeperServer | None]:
    """The workers speak to one Redis URL, PostgreSQL or the session's ZooKeeper: no
    cluster backend here."""
    server = request.getfixturevalue("zookeeper_server") if request.param == "zookeeper" else None
    return request.param, server


def worker_args(mode: str, backend: Backend, database_url: str, *extra: str) -> list[str]:
    zookeeper = [] if backend.zookeeper is None else ["--zookeeper", backend.zookeeper.hosts]
    return [
        mode,
        *("--backend", backend.kind, "--redis-url", REDIS_URL, "--dsn", database_url),
        *("--name", backend.name, *zookeeper, *extra),
    ]


async def test_three_processes_of_twenty_tasks_never_overlap(
    backend: Backend, database_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """3 processes x 20 tasks x 10 non-atomic increments under the lock end at exactly
    600, and the fences seen inside the lock strictly increase in the order taken."""
    counter, log = f"{key_prefix}:counter", f"{key_prefix}:fences"
    args = worker_args("count", backend, database_url, "--counter", counter, "--log", log)
    async with workers(args, args, args, tmp=tmp_path) as procs:
        for proc in procs:
            await proc.expect("READY", within=20)
        for proc in procs:  # start together, so the processes really contend
            await proc.send("go")
        for proc in procs:
            await proc.expect("DONE", within=40)
    assert int(await backend.redis.get(counter) or 0) == 600
    fences = [int(f) for f in await backend.redis.lrange(log, 0, -1)]
    assert len(fences) == 600
    assert all(a < b for a, b in itertools.pairwise(fences))


async def test_a_killed_holder_frees_the_lock_within_its_lease(
    backend: Backend, database_url: str, tmp_path: Path
) -> None:
    """SIGKILL the holder: another process gets the lock within lease + a small margin
    (Redis: the lease runs out; PostgreSQL: the session ends with the process;
    ZooKeeper: the server expires the session, whose timeout is the lease)."""
    lease = 1.0
    async with workers(
        worker_args("hold", backend, database_url, "--lease", str(lease)), tmp=tmp_path
    ) as (holder,):
        holder_fence = int((await holder.expect("ACQUIRED", within=20))[1])
        other = backend.new(lease=lease)
        assert not await other.acquire(wait=0)
        holder.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        assert await other.acquire(wait=lease + 3)
        assert time.monotonic() - killed_at < lease + 0.5
        assert other.fence > holder_fence
        await other.release()


@pytest.fixture
async def table(database_url: str, key_prefix: str) -> AsyncIterator[str]:
    """A one-row table written only under a fence (``fence <= $fence``)."""
    table = f"fenced_{key_prefix}"
    con = await asyncpg.connect(database_url)
    await con.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, value text, fence bigint)")
    await con.execute(f"INSERT INTO {table} VALUES (1, 'initial', 0)")
    yield table
    await con.execute(f"DROP TABLE {table}")
    await con.close()


async def stopped_holder_is_fenced_out(
    args: list[str],
    *,
    tmp: Path,
    database_url: str,
    table: str,
    freed: Callable[[], Awaitable[bool]],
    take_over: Callable[[], AnyLock],
) -> None:
    """Start a ``stale`` worker, SIGSTOP it, wait until ``freed()``, take the lock with
    ``take_over()`` and write under it, then wake the worker: it must hear of the loss
    and its writes after waking must be rejected by the fence."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        async with workers(args, tmp=tmp) as (stale,):
            stale_fence = int((await stale.expect("ACQUIRED", within=20))[1])
            assert (await stale.expect("WROTE"))[1] == "1"
            stale.signal(signal.SIGSTOP)
            await wait_for(freed, within=5, what="the stopped holder's lock freed")
            lock = take_over()
            async with lock(wait=5):
                assert lock.fence > stale_fence
                assert await fenced_write(pool, table, "B", lock.fence) == 1
                stale.signal(signal.SIGCONT)
                lines = await stale.lines_until("LATE", within=10)
                final = await pool.fetchrow(f"SELECT value, fence FROM {table} WHERE id = 1")
                assert final is not None and tuple(final) == ("B", lock.fence)
    finally:
        await pool.close()
    assert ["LOCKLOST", "1"] in lines, lines
    assert lines[-1] == ["LATE", "0"]
    # Lines from before the stop may still have been in the pipe ("WROTE 1"); whatever
    # it wrote after waking, before hearing of the loss, was rejected ("WROTE 0").
    wrote = [int(words[1]) for words in lines if words[0] == "WROTE"]
    assert wrote == sorted(wrote, reverse=True), lines


class TestStaleHolder:
    """A holder stopped past its lease loses the lock to another process; woken, it is
    told (``lost``, LockLost) and its fenced write is rejected by PostgreSQL."""

    async def test_a_stopped_holder_is_fenced_out(
        self, redis: Redis, database_url: str, key_prefix: str, table: str, tmp_path: Path
    ) -> None:
        name = lock_key(key_prefix, "lock")
        subscriber = LockSubscriber(redis)
        backend = Backend("redis", redis, None, name, subscriber)
        args = worker_args("stale", backend, database_url, "--lease", "0.5", "--table", table)
        try:
            await stopped_holder_is_fenced_out(
                args,
                tmp=tmp_path,
                database_url=database_url,
                table=table,
                # Nobody renews the stopped holder's lease: it runs out.
                freed=lambda: _gone(redis, name),
                take_over=lambda: RedisLock(redis, name, lease=5, subscriber=subscriber),
            )
        finally:
            await subscriber.aclose()


class TestStaleZooKeeperHolder:
    """A ZooKeeper holder stopped past its session timeout: the server expires the
    session and deletes its node, another process takes the lock with a larger czxid;
    woken, the old holder is told and its fenced write is rejected."""

    @pytest.fixture
    def backend_kind(self, zookeeper_server: ZooKeeperServer) -> tuple[str, ZooKeeperServer]:
        return "zookeeper", zookeeper_server

    async def test_a_stopped_holder_is_fenced_out(
        self, backend: Backend, database_url: str, table: str, tmp_path: Path
    ) -> None:
        assert backend.zookeeper is not None
        await stopped_holder_is_fenced_out(
            worker_args("stale", backend, database_url, "--lease", "0.5", "--table", table),
            tmp=tmp_path,
            database_url=database_url,
            table=table,
            # The stopped holder sends no heartbeat: the server expires its session.
            freed=backend.is_free,
            take_over=lambda: backend.new(lease=5),
        )


async def _gone(redis: Redis, key: str) -> bool:
    return await redis.exists(key) == 0
