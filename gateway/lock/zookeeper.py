"""ZooKeeper backend: the ephemeral sequential recipe, fenced by the node's czxid.

A contender creates an ephemeral sequential node under ``<root>/<name>``; the lowest
sequence holds the lock, every other contender watches the node just before its own
(no herd: one release wakes one waiter). The node lives as long as the holder's
session, so a killed holder's lock goes when the server expires its session.

**Client: kazoo 2.11, bridged to asyncio** (:mod:`gateway.lock.zk_session`). kazoo
is the Python ZooKeeper client most of the ecosystem runs on (python-zk; it has
handled reconnection, session expiry and retries for a decade); aiozk is natively
asyncio but a far smaller project with fewer users to have found its bugs. The
bridge uses kazoo's ``*_async`` calls and hands results over with
``call_soon_threadsafe``, so no thread is parked per call or per waiter. The recipe
is ours on kazoo's primitives rather than ``kazoo.recipe.lock.Lock``, which blocks a
thread, is neither task-owned nor re-entrant, and gives neither a fence nor a loss
signal; :class:`BaseLock` supplies those, the backend five hooks.

**Fence: the node's czxid** (the zxid of the transaction that created it), plus
:data:`FENCE_BASE`. A sequence number counts per parent node and starts again if
the parent is ever deleted and created anew; a zxid is ensemble-wide and only grows,
across sessions, client restarts and leader elections (the election epoch is its
high 32 bits). The holder is the lowest node present, so a later holder's node was
created later and its czxid is larger. The base lifts these fencing tokens above the
microsecond-clock tokens of the Redis and PostgreSQL locks (about 2**51), so a sku
moved from those families to ZooKeeper is not fenced out by the row's old token;
moving back the other way needs the row's fence reset, since a lower token never
passes the fenced UPDATE again.

**Lease and session.** The watchdog renews every lease/3 by reading the node's stat
and checking that the current session still owns it. A read that succeeds proves
the session alive when it was sent, and the server keeps a session at least its
timeout after the last request it heard; so with ``lease <= session timeout`` a
holder's local deadline (last proof + lease) passes before anyone else can be
granted the lock. The server may cut the timeout it was asked for to its
``maxSessionTimeout`` (20 ticks, 40 s, by default), which kazoo does not report:
keep the lease within it. A session that expired (SUSPENDED then LOST, a holder stopped
past its timeout) fires the node's watch, or fails the next renewal: the hold is
lost and the ``async with`` body cancelled. Deleting the node behind the holder's
back does the same at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from gateway.lock.base import BaseLock
from gateway.lock.errors import LockError
from gateway.lock.holds import Grant, Hold
from gateway.lock.metrics import LockMetrics
from gateway.lock.zk_session import UNREACHABLE, ZkNode, ZkSession

ROOT = "/flashsale/locks"
# Above every microsecond-clock fence of the other families (2**62 us is 146,000
# years), below bigint's limit for any czxid of a real ensemble (epoch < 2**20).
FENCE_BASE = 1 << 62
_SEQUENCE_DIGITS = 10  # ZooKeeper's zero-padded suffix of a sequential node
# A node left by an acquisition whose reply was lost is looked for this long.
_SWEEP_S = 30.0


@dataclass(eq=False, slots=True)
class ZkHold:
    """The node a hold owns and the session that created it."""

    path: str
    session_id: int


class ZooKeeperLock(BaseLock[ZkHold]):
    """A re-entrant distributed lock on ZooKeeper ephemeral sequential nodes.

    Same interface and semantics as :class:`RedisLock`.

    Args:
        session: the process's started :class:`ZkSession`; share one per process.
        name: the lock's name, one node name (no ``/``), e.g. ``fs:{sku1}:lock``.
        lease: seconds the watchdog trusts its last proof of the session; at most
            the session timeout, which it is if None (see the module docstring).
            Checks every lease/3.
        max_hold: stop renewing this many seconds after acquisition.
        metrics: a :class:`LockMetrics`; a fresh :class:`LockStats` if None.
        root: the parent of every lock's node.
    """

    def __init__(
        self,
        session: ZkSession,
        name: str,
        *,
        lease: float | None = None,
        max_hold: float | None = None,
        metrics: LockMetrics | None = None,
        root: str = ROOT,
    ) -> None:
        if "/" in name:
            raise ValueError(f"a ZooKeeper lock name is one node name: {name!r}")
        lease = session.session_timeout if lease is None else lease
        if lease > session.session_timeout:
            raise ValueError("lease must not exceed the session timeout")
        super().__init__(name, lease=lease, max_hold=max_hold, metrics=metrics)
        self._session = session
        self.path = f"{root}/{name}"

    async def _grant(self, owner: str, deadline: float | None) -> Grant[ZkHold] | None:
        nonce = uuid.uuid4().hex
        node = await self._bg.undoable(
            self._create(nonce, owner), lambda made: self._session.delete(made[0])
        )
        granted = False
        try:
            grant = await self._wait_turn(node, deadline)
            granted = grant is not None
            return grant
        finally:
            if not granted:  # timed out, cancelled or failed: leave nothing behind
                self._bg.spawn(self._delete_patiently(node[0]))

    async def _create(self, nonce: str, owner: str) -> ZkNode:
        try:
            return await self._session.create(f"{self.path}/{nonce}-", owner.encode())
        except UNREACHABLE:
            # The node may exist though the reply was lost; its name carries our nonce.
            self._bg.spawn(self._sweep(nonce))
            raise

    async def _wait_turn(self, node: ZkNode, deadline: float | None) -> Grant[ZkHold] | None:
        """Wait until ``node`` is the lowest under the lock (None: the deadline passed)."""
        path, stat = node
        mine = path.rsplit("/", 1)[1]
        contended = False
        while True:
            checked = time.monotonic()  # the session answered after this: the lease counts
            contenders = sorted(await self._session.children(self.path), key=_sequence)
            if mine not in contenders:
                raise LockError(self.name, "the waiting node vanished: the session expired")
            ahead = contenders.index(mine)
            if ahead == 0:
                hold = ZkHold(path, int(stat.ephemeralOwner))
                await self._watch(hold)
                return Grant(FENCE_BASE + int(stat.czxid), hold, contended, checked)
            contended = True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            turn = asyncio.Event()
            before = f"{self.path}/{contenders[ahead - 1]}"
            if await self._session.exists(before, watch=_waking(turn)) is None:
                continue
            # Look again at least once a session timeout: an expiry may drop the watch.
            wait = self._session.session_timeout
            if left is not None:
                wait = min(left, wait)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await turn.wait()

    async def _watch(self, hold: ZkHold) -> None:
        """Lose the hold as soon as its node is deleted or its session ends."""

        def on_event(gone: bool) -> None:
            owned = self._holds.of_resource(hold)
            if gone and owned is not None and owned.live and not owned.closing:
                self._declare_lost(owned, cancel=True)

        await self._session.exists(hold.path, watch=on_event)

    async def _ours(self, hold: Hold[ZkHold]) -> bool:
        stat = await self._session.exists(hold.resource.path)
        return stat is not None and int(stat.ephemeralOwner) == hold.resource.session_id

    async def _reenter(self, hold: Hold[ZkHold]) -> bool:
        return await self._ours(hold)

    async def _release_one(self, hold: Hold[ZkHold]) -> int:
        if hold.count > 1:
            return hold.count - 1
        # The path is unique to this hold: deleting it can never free another's lock.
        return 0 if await self._session.delete(hold.resource.path) else -1

    async def _renew(self, hold: Hold[ZkHold]) -> bool:
        return await self._ours(hold)

    async def _discard(self, hold: Hold[ZkHold]) -> None:
        await self._delete_patiently(hold.resource.path)

    async def _delete_patiently(self, path: str) -> None:
        """Delete a node we no longer want, retrying while the server is unreachable
        (the session, and so the node, may outlive the outage); must not raise."""
        stop_at = time.monotonic() + _SWEEP_S
        while time.monotonic() < stop_at:
            try:
                await self._session.delete(path)
                return
            except UNREACHABLE:
                await asyncio.sleep(self.lease / 3)
            except Exception:
                return  # anything but an outage will not get better by retrying

    async def _sweep(self, nonce: str) -> None:
        """Delete the node of a create whose reply was lost, once it can be listed."""
        stop_at = time.monotonic() + _SWEEP_S
        while time.monotonic() < stop_at:
            try:
                names = await self._session.children(self.path)
            except UNREACHABLE:
                await asyncio.sleep(self.lease / 3)
                continue
            except Exception:
                return
            for name in names:
                if name.startswith(f"{nonce}-"):
                    await self._delete_patiently(f"{self.path}/{name}")
            return


def _waking(event: asyncio.Event) -> Callable[[bool], None]:
    """A watch that sets ``event`` whatever happened to the node."""
    return lambda _gone: event.set()


def _sequence(node_name: str) -> int:
    """The sequence number ZooKeeper appended to a node's name."""
    return int(node_name[-_SEQUENCE_DIGITS:])
