"""What only the Redis lock does: the shared unlock subscriber, the TTL-bounded poll,
cancellation after a script has already acted, and a Redis that restarts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import RedisError

from gateway.lock import LockLost, LockStats, LockSubscriber, RedisLock
from testkit.polling import wait_for
from testkit.redis_servers import RedisServer
from testkit.services import REDIS_URL
from tests.integration.lock_support import Subscribers

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def subs() -> AsyncIterator[Subscribers]:
    """One unlock subscriber per client, closed after the test."""
    made = Subscribers()
    yield made
    await made.aclose()


class GatedRedis(Redis):
    """Holds script replies back while ``gate`` is closed: Redis has acted, the caller
    has not heard yet — the moment to cancel it."""

    gate: asyncio.Event | None = None

    async def evalsha(self, *args: Any, **kwargs: Any) -> Any:
        reply = await super().evalsha(*args, **kwargs)
        if self.gate is not None:
            await self.gate.wait()
        return reply


@pytest.fixture
async def gated() -> AsyncIterator[GatedRedis]:
    """A client whose script replies can be held back."""
    client = GatedRedis.from_url(REDIS_URL)
    assert isinstance(client, GatedRedis)
    yield client
    await client.aclose()


@pytest.fixture
async def blocking() -> AsyncIterator[Redis]:
    """A client whose pool (20 connections) makes callers wait rather than fail."""
    client = Redis.from_pool(BlockingConnectionPool.from_url(REDIS_URL, max_connections=20))
    yield client
    await client.aclose()


class TestWaking:
    """Waiters wake on the unlock message through one subscriber per process."""

    async def test_a_waiter_wakes_on_unlock_long_before_its_poll(
        self, redis: Redis, name: str, subs: Subscribers
    ) -> None:
        holder, waiter = subs.lock(redis, name, lease=10), subs.lock(redis, name, lease=10)
        await holder.acquire()
        acquired_at = 0.0

        async def wait() -> None:
            nonlocal acquired_at
            assert await waiter.acquire(wait=15)
            acquired_at = time.monotonic()
            await waiter.release()

        task = asyncio.create_task(wait())
        await wait_for(lambda: subs.of(redis).waiting == 1, what="one waiter subscribed")
        released_at = time.monotonic()
        await holder.release()
        await asyncio.wait_for(task, 15)
        # Its poll is bounded by the holder's TTL, about 10 s here.
        assert acquired_at - released_at < 1.0

    async def test_a_waiter_polls_when_no_message_comes(
        self, redis: Redis, name: str, subs: Subscribers
    ) -> None:
        # A holder from nowhere: its lease runs out without anyone publishing an unlock.
        await redis.hset(name, mapping={"owner": "ghost", "count": 1, "fence": 0})
        await redis.pexpire(name, 300)
        lock = subs.lock(redis, name)
        assert await lock.acquire(wait=3)
        await lock.release()

    async def test_a_waiter_that_cannot_hear_unlocks_polls_briskly(
        self, redis: Redis, name: str
    ) -> None:
        """A waiter whose subscription is not confirmed (here: its subscriber is
        closed, as when Redis was unreachable or a loaded start outran the
        confirmation) may have missed the unlock already: it polls, rather than
        sleeping to the end of a 30 s lease (or of its own 10 s wait), and takes the
        lock soon after the holder let go, before a third party takes it 3 s later.
        (Before, it slept the holder's whole TTL: a flush in the Redis Cluster test
        stalled 10 s behind a 50 ms hold.)"""
        deaf = LockSubscriber(redis)
        await deaf.aclose()
        holder = RedisLock(redis, name, lease=30, subscriber=deaf)
        waiter = RedisLock(redis, name, lease=30, subscriber=deaf)
        await holder.acquire()

        async def take_and_release() -> bool:
            taken = await waiter.acquire(wait=10)
            if taken:
                await waiter.release()
            return taken

        task = asyncio.create_task(take_and_release())
        await asyncio.sleep(0.2)  # the waiter has tried once and is waiting
        await holder.release()
        # Another process takes the lock 3 s later and keeps it: a waiter asleep
        # to the end of its wait would find it taken and give up.
        await asyncio.sleep(3.0)
        late = RedisLock(redis, name, lease=30, subscriber=deaf)
        assert await late.acquire(wait=5)
        assert await asyncio.wait_for(task, 15), "the waiter slept through the free lock"
        await late.release()

    async def test_two_hundred_waiters_share_one_subscriber_connection(
        self, blocking: Redis, redis: Redis, name: str, subs: Subscribers
    ) -> None:
        # 200 first attempts at once need connections (a default pool has 100); waiting
        # needs none but the shared subscriber's.
        holder = subs.lock(blocking, name, lease=10)
        await holder.acquire()
        order: list[int] = []

        async def wait() -> None:
            lock = subs.lock(blocking, name, lease=10)
            async with lock(wait=20):
                order.append(lock.fence)

        tasks = [asyncio.create_task(wait()) for _ in range(200)]
        subscriber = subs.of(blocking)
        await wait_for(lambda: subscriber.waiting == 200, within=10, what="200 waiters")
        channel = name + ":unlock"
        assert await redis.pubsub_numsub(channel) == [(channel.encode(), 1)]
        clients = await redis.client_list()
        named = [c for c in clients if c["name"] == subscriber.client_name and c["sub"] != "0"]
        assert len(named) == 1, named
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
        assert len(order) == 200 and order == sorted(set(order))
        assert order[0] > holder.fence


class TestCancellation:
    """A caller cancelled after its script ran leaves a consistent lock."""

    async def test_cancelled_after_the_acquire_script_ran_gives_the_lock_back(
        self, gated: GatedRedis, redis: Redis, name: str, subs: Subscribers
    ) -> None:
        gated.gate = asyncio.Event()
        lock = subs.lock(gated, name)
        task = asyncio.create_task(lock.acquire())
        # Granted; the reply waits.
        await wait_for(lambda: _is_one(redis.exists(name)), what="the lock granted")
        task.cancel()
        gated.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not await redis.exists(name)
        assert not lock.held

    async def test_a_cancelled_release_still_completes(
        self, gated: GatedRedis, redis: Redis, name: str, subs: Subscribers
    ) -> None:
        lock = subs.lock(gated, name)
        acquired, go = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            await lock.acquire()
            acquired.set()
            await go.wait()
            await lock.release()

        task = asyncio.create_task(hold())
        await asyncio.wait_for(acquired.wait(), 5)
        gated.gate = asyncio.Event()
        go.set()
        # Released; the reply is held back.
        await wait_for(lambda: _is_zero(redis.exists(name)), what="the lock released")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gated.gate.set()
        await wait_for(lambda: not lock.held, what="the lock object let go")
        assert isinstance(lock.metrics, LockStats) and lock.metrics.releases == 1


async def _is_zero(value: Awaitable[int]) -> bool:
    return await value == 0


async def _is_one(value: Awaitable[int]) -> bool:
    return await value == 1


class TestClose:
    """Closing the subscriber ends its loops, whatever its connection was doing."""

    async def test_close_ends_the_loops_even_when_a_cancel_is_lost(self) -> None:
        """A client library's cleanup that raises while a cancel is handled turns
        the CancelledError into an ordinary error, which the writer takes for a
        broken connection. The subscriber's close still ends, within seconds,
        instead of waiting for that loop forever (it held a stopping gateway)."""
        redis = Redis.from_url(REDIS_URL)
        subscriber = LockSubscriber(redis, ready_timeout=0.2)
        writing = asyncio.Event()

        async def cleanup_raises(conn: object) -> None:
            writing.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise RedisError("cleanup failed while cancelled") from None

        subscriber._sync = cleanup_raises  # type: ignore[method-assign]
        try:
            async with subscriber.subscription("close-test"):
                await wait_for(writing.is_set, within=5, what="the writer is writing")
            async with asyncio.timeout(5):
                await subscriber.aclose()
        finally:
            await redis.aclose()


class TestRestart:
    """A Redis restart takes every lock with it: the holder must hear about it."""

    @pytest.fixture
    async def server(self) -> AsyncIterator[RedisServer]:
        """A private redis-server, never the shared one."""
        async with RedisServer() as server:
            yield server

    async def test_the_holder_learns_lost_when_redis_restarts(
        self, server: RedisServer, name: str, subs: Subscribers
    ) -> None:
        client = Redis.from_url(server.url())
        try:
            lock = subs.lock(client, name, lease=1.0)
            entered = asyncio.Event()

            async def hold() -> None:
                async with lock:
                    entered.set()
                    await asyncio.Event().wait()

            task = asyncio.create_task(hold())
            await asyncio.wait_for(entered.wait(), 5)
            before = lock.fence
            await server.restart()
            with pytest.raises(LockLost):
                await asyncio.wait_for(task, 10)
            assert lock.lost.is_set()
            # After the restart the scripts are reloaded on NOSCRIPT and locks work again.
            again = subs.lock(client, name, lease=1.0)
            assert await again.acquire(wait=5)
            # The counter went with the restart; the clock floor keeps tokens increasing.
            assert again.fence > before
            await again.release()
        finally:
            await client.aclose()

    async def test_the_holder_learns_lost_when_redis_stays_unreachable(
        self, server: RedisServer, name: str, subs: Subscribers
    ) -> None:
        client = Redis.from_url(server.url())
        try:
            lock = subs.lock(client, name, lease=1.0)
            with pytest.raises(LockLost):
                async with asyncio.timeout(10), lock:
                    await server.stop()  # renewals fail until the local deadline passes
                    await asyncio.Event().wait()
            assert lock.lost.is_set()
            assert isinstance(lock.metrics, LockStats)
            assert lock.metrics.renewal_failures > 0 and lock.metrics.losses == 1
        finally:
            await client.aclose()

    async def test_a_release_that_cannot_get_through_is_abandoned(
        self, server: RedisServer, name: str, subs: Subscribers
    ) -> None:
        """Redis gone when the block ends: the release error leaves the block, and
        the hold is dropped locally, so its watchdog stops renewing for good.

        Killed, and a lease of 1 s: the block must end before the lease runs out
        (then the lock is lost, not released), and a loaded run's SIGTERM shutdown
        of Redis outlasted a lease of 0.3 s."""
        client = Redis.from_url(server.url())
        try:
            lock = subs.lock(client, name, lease=1.0)
            assert isinstance(lock.metrics, LockStats)
            with pytest.raises(RedisError):
                async with lock:
                    await server.kill()
            assert not lock.held
            attempts = lock.metrics.renewals + lock.metrics.renewal_failures
            await asyncio.sleep(0.5)  # longer than one renewal period: none may happen
            assert lock.metrics.renewals + lock.metrics.renewal_failures == attempts
        finally:
            await client.aclose()
