"""What only the ZooKeeper lock has: a session that keeps the lock alive, a session
expiry reported as a loss, FIFO waiters, and fences that survive a new session.
Real ZooKeeper (the session's private server)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator

import pytest
from kazoo.client import KazooClient

from gateway.lock import LockLost
from gateway.lock.zk_session import ZkSession
from gateway.lock.zookeeper import ROOT, ZooKeeperLock
from testkit.polling import wait_for
from testkit.zookeeper_servers import ZooKeeperEnsemble, ZooKeeperServer

pytestmark = pytest.mark.timeout(60)

# Short, so a few seconds outlast several timeouts; not shorter: kazoo pings from a
# thread every third of it, and a loaded machine (CI with a CPU burner) starved
# 0.6 s sessions of their pings.
SHORT_SESSION_S = 1.2


@pytest.fixture
async def session(zookeeper_server: ZooKeeperServer) -> AsyncIterator[ZkSession]:
    """A session whose timeout is short, so a few seconds outlast many timeouts."""
    started = ZkSession(zookeeper_server.hosts, session_timeout=SHORT_SESSION_S)
    await started.start(wait=10)
    yield started
    await started.stop()


def expire(server: ZooKeeperServer, session: ZkSession) -> None:
    """Expire ``session`` on the server: another client joins it and closes it (the
    server then ends the session and deletes its ephemeral nodes)."""
    client_id = session.client_id
    assert client_id is not None
    intruder = KazooClient(hosts=server.hosts, client_id=client_id, timeout=SHORT_SESSION_S)
    intruder.start(timeout=10)
    intruder.stop()
    intruder.close()


class TestSession:
    """The session, not a renewal of our own, keeps the lock; its end loses it."""

    async def test_the_lock_outlives_many_session_timeouts_while_the_holder_lives(
        self, session: ZkSession, name: str
    ) -> None:
        lock = ZooKeeperLock(session, name)
        assert lock.lease == SHORT_SESSION_S
        async with lock:
            first_session = session.session_id
            await asyncio.sleep(4 * SHORT_SESSION_S)
            assert lock.held and not lock.lost.is_set()
            assert session.session_id == first_session  # never expired meanwhile
            other = ZooKeeperLock(session, name)
            assert not await asyncio.create_task(other.acquire(wait=0))

    async def test_an_expired_session_is_lost_cancels_the_body_and_fences_higher_after(
        self, session: ZkSession, name: str, zookeeper_server: ZooKeeperServer
    ) -> None:
        lock = ZooKeeperLock(session, name)
        cancelled = False
        with pytest.raises(LockLost):
            async with asyncio.timeout(10), lock:
                old_fence = lock.fence
                await asyncio.get_running_loop().run_in_executor(
                    None, expire, zookeeper_server, session
                )
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cancelled = True
                    raise
        assert cancelled and lock.lost.is_set() and lock.metrics.losses == 1  # type: ignore[attr-defined]
        # kazoo opens a new session; the next holder's czxid is larger.
        await wait_for(lambda: session.connected, within=10, what="a new session")
        async with lock(wait=5):
            assert lock.fence > old_fence


class TestQueue:
    """Waiters queue on their node's sequence: first come, first served."""

    async def test_waiters_are_served_in_arrival_order(self, session: ZkSession, name: str) -> None:
        holder = ZooKeeperLock(session, name)
        await holder.acquire()
        served: list[int] = []

        async def contender(i: int) -> None:
            lock = ZooKeeperLock(session, name)
            async with lock(wait=10):
                served.append(i)

        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(contender(i)))
            # the next one arrives only once this one's node is queued
            queued = functools.partial(_nodes, session, name, i + 2)
            await wait_for(queued, within=5, what="node queued")
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert served == [0, 1, 2, 3, 4]
        assert await session.children(f"{ROOT}/{name}") == []

    async def test_a_timed_out_waiter_leaves_no_node_behind(
        self, session: ZkSession, name: str
    ) -> None:
        holder, waiter = ZooKeeperLock(session, name), ZooKeeperLock(session, name)
        await holder.acquire()
        assert not await waiter.acquire(wait=0.2)
        await wait_for(lambda: _nodes(session, name, 1), what="only the holder's node")
        await holder.release()


class TestEnsemble:
    """Three members, the leader killed under a held lock: a new leader is elected,
    the holder's session moves to a survivor, the lock stays its own and exclusive."""

    async def test_the_lock_survives_the_leader_killed_and_stays_exclusive(self, name: str) -> None:
        async with ZooKeeperEnsemble() as ensemble:
            sessions = [ZkSession(ensemble.hosts, session_timeout=5.0) for _ in range(2)]
            for started in sessions:
                await started.start(wait=30)
            try:
                holder, contender = (ZooKeeperLock(s, name) for s in sessions)
                async with holder:
                    first, fence = sessions[0].session_id, holder.fence
                    await (await ensemble.leader()).kill()
                    survivors = [m for m in ensemble.members if m.running]
                    for member in survivors:
                        await wait_for(member.serving, within=20, what="a new quorum")
                    await wait_for(lambda: sessions[0].connected, within=10, what="reconnected")
                    assert not await asyncio.create_task(contender.acquire(wait=0.5))
                    assert holder.held and not holder.lost.is_set()
                    assert sessions[0].session_id == first  # the same session, moved
                assert await asyncio.create_task(contender.acquire(wait=5))
                assert contender.fence > fence
            finally:
                for started in sessions:
                    await started.stop()


async def _nodes(session: ZkSession, name: str, count: int) -> bool:
    return len(await session.children(f"{ROOT}/{name}")) == count
