"""The backend-independent half of a lock: holds per task, ``async with``, and loss.

The owner of a hold is (lock object, asyncio task), so the same task re-enters (the
hold counts up) and any other task is refused. A :class:`Watchdog` renews each hold
through three callbacks; when it declares the hold lost, ``lost`` is set and, inside
``async with``, the owner task is cancelled and the block leaves with :class:`LockLost`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from abc import ABC, abstractmethod
from typing import Any, Generic, Self, TypeVar

from gateway.lock.errors import LockLost, LockNotOwned, LockTimeout
from gateway.lock.holds import Grant, Hold, HoldState, HoldTable
from gateway.lock.metrics import LockMetrics, LockStats
from gateway.lock.tasks import Background, Owners
from gateway.lock.watchdog import Watchdog

R = TypeVar("R")  # what a backend keeps per hold (PostgreSQL: its connection)


class BaseLock(ABC, Generic[R]):
    """A re-entrant, task-owned lock with a watchdog; backends supply five hooks.

    ``async with lock:`` waits without limit; ``async with lock(wait=s):`` raises
    :class:`LockTimeout` when ``s`` seconds pass. If the hold is lost inside the block,
    the block is cancelled and leaves with :class:`LockLost` (outer cancellations are
    never swallowed). Do not call :meth:`release` inside ``async with``.
    """

    def __init__(
        self, name: str, *, lease: float, max_hold: float | None, metrics: LockMetrics | None
    ) -> None:
        if lease <= 0:
            raise ValueError("lease must be positive")
        if max_hold is not None and max_hold <= 0:
            raise ValueError("max_hold must be positive")
        self.name = name
        self.lease = lease
        self.max_hold = max_hold
        self.metrics: LockMetrics = metrics if metrics is not None else LockStats()
        self._owners = Owners()
        self._holds: HoldTable[R] = HoldTable()
        self._not_lost = asyncio.Event()
        self._bg = Background()
        lose = functools.partial(self._declare_lost, cancel=True)
        self._watchdog = Watchdog(
            name, lease, max_hold, self.metrics, self._renew, lose, self._expire
        )

    @abstractmethod
    async def _grant(self, owner: str, deadline: float | None) -> Grant[R] | None:
        """Take the free lock for ``owner``, waiting until ``deadline`` (monotonic, None:
        no limit); None when it passed. Must leave nothing taken if cancelled."""

    @abstractmethod
    async def _reenter(self, hold: Hold[R]) -> bool:
        """Count one more hold; False if the backend says the lock is not ours."""

    @abstractmethod
    async def _release_one(self, hold: Hold[R]) -> int:
        """Release one hold: the holds left (0: freed), or -1 if it was not ours."""

    @abstractmethod
    async def _renew(self, hold: Hold[R]) -> bool:
        """Extend the lease; False if the lock is not ours; raises if unreachable."""

    async def _discard(self, hold: Hold[R]) -> None:
        """Free what a lost or abandoned hold keeps locally; must not raise."""

    @property
    def fence(self) -> int:
        """The fencing token of the calling task's hold, kept after a loss so a stale
        holder writes with its own older token; else the latest hold's; 0 before any."""
        hold = self._holds.visible()
        return 0 if hold is None else hold.fence

    @property
    def lost(self) -> asyncio.Event:
        """Set when the calling task's hold (else the latest hold) is lost. Each first
        acquisition has a new event: read it after acquiring."""
        hold = self._holds.visible()
        return self._not_lost if hold is None else hold.lost

    @property
    def held(self) -> bool:
        """Whether some task holds the lock through this object, not lost, lease not run out."""
        return self._holds.any_live()

    async def acquire(self, wait: float | None = None) -> bool:
        """Take the lock for the calling task.

        Args:
            wait: None waits without limit, 0 tries once, otherwise seconds to wait.
        Returns:
            True when held (a re-entry by the holding task adds a hold); False if the
            wait ran out.
        Raises:
            LockLost: on re-entry, the task's hold turned out to be lost.
        Backend errors (``redis.exceptions.RedisError``, asyncpg errors) propagate.
        """
        task = self._owners.current(self.name)
        hold = self._holds.get(task)
        if hold is not None and hold.live:
            if not await self._reenter(hold):
                self._declare_lost(hold, cancel=False)
                raise LockLost(self.name)
            hold.count += 1
            return True
        started = time.monotonic()
        deadline = None if wait is None else started + max(wait, 0.0)
        grant = await self._grant(self._owners.id_of(task), deadline)
        if grant is None:
            self.metrics.timed_out()
            return False
        self._begin(task, grant, started)
        return True

    async def release(self) -> None:
        """Release one hold of the calling task; the last one frees the lock.

        Shielded from cancellation (a cancelled release still completes). Local state is
        cleared only once the backend confirmed, so after an error a retry is safe.

        Raises:
            LockNotOwned: the calling task holds nothing through this object; nothing changes.
            LockLost: the hold had been lost. The hold counts as released: once all of
                a lost hold's acquisitions are released, further calls raise LockNotOwned.
        """
        hold = self._holds.get(self._owners.current(self.name))
        if hold is None:
            raise LockNotOwned(self.name)
        await self._bg.shielded(self._release(hold))

    def abandon(self) -> None:
        """Forget the calling task's hold without the backend: for a release that
        could not get through. The watchdog stops, so the lease runs out by itself
        (PostgreSQL: the session goes back to the pool, whose reset unlocks it).
        Does nothing when the task holds nothing."""
        hold = self._holds.get(self._owners.current(self.name))
        if hold is not None:
            self._abandon(hold)

    def __call__(self, wait: float | None = None) -> _Entry[R]:
        """``async with lock(wait=5.0):`` — like ``async with lock:`` with a bounded wait."""
        return _Entry(self, wait)

    async def __aenter__(self) -> Self:
        await self._enter(None)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._exit(exc_info[0], exc_info[1])

    def _begin(self, task: asyncio.Task[Any], grant: Grant[R], started: float) -> None:
        stale = self._holds.get(task)
        if stale is not None:  # a lost hold its task never released
            self._finish(stale)
        now = time.monotonic()
        hold = Hold(
            task=task,
            owner=self._owners.id_of(task),
            fence=grant.fence,
            resource=grant.resource,
            acquired_at=now,
            renewed_at=grant.sent_at,
            deadline=grant.sent_at + self.lease,
        )
        self._holds.add(hold)
        # Most holds end before their first renewal: a timer is cheaper than a task.
        first = min(self.lease / 3, self.max_hold or self.lease)
        hold.timer = asyncio.get_running_loop().call_later(first, self._ensure_watchdog, hold)
        self.metrics.acquired(now - started, contended=grant.contended)

    async def _release(self, hold: Hold[R]) -> None:
        if not hold.live:
            self._holds.drop_one(hold)
            raise LockLost(self.name)
        hold.closing = hold.count == 1
        try:
            left = await self._release_one(hold)
        except BaseException:
            hold.closing = False
            self._ensure_watchdog(hold)
            raise
        if left < 0:
            self._declare_lost(hold, cancel=False)
            self._holds.drop_one(hold)
            raise LockLost(self.name)
        hold.count = left
        if left == 0:
            self._finish(hold)
            self.metrics.released(time.monotonic() - hold.acquired_at)

    def _finish(self, hold: Hold[R]) -> None:
        hold.state = HoldState.ENDED
        self._holds.forget(hold)
        if hold.timer is not None:
            hold.timer.cancel()
        if hold.watchdog is not None and hold.watchdog is not asyncio.current_task():
            hold.watchdog.cancel()

    async def _expire(self, hold: Hold[R]) -> None:
        """An abandoned hold's lease ran out: nobody is left to tell."""
        hold.state = HoldState.ENDED
        self._holds.forget(hold)
        await self._discard(hold)

    def _abandon(self, hold: Hold[R]) -> None:
        self._finish(hold)
        self._bg.spawn(self._discard(hold))

    def _declare_lost(self, hold: Hold[R], *, cancel: bool) -> None:
        if not hold.live:
            return
        hold.state = HoldState.LOST
        hold.lost.set()
        self.metrics.lost()
        if cancel and hold.entries and not hold.task.done():
            hold.cancelled_owner = True
            hold.task.cancel(f"lock {self.name!r} lost")
        # A task that never gives the lost hold back must not pin it here forever.
        hold.task.add_done_callback(lambda _: self._holds.forget(hold))
        self._bg.spawn(self._discard(hold))

    async def _enter(self, wait: float | None) -> None:
        if not await self.acquire(wait):
            raise LockTimeout(self.name)
        task = self._owners.current(self.name)
        hold = self._holds.get(task)
        assert hold is not None  # acquired just now by this task
        hold.entries.append(task.cancelling())

    async def _exit(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        task = self._owners.current(self.name)
        hold = self._holds.get(task)
        if hold is None or not hold.entries:
            return  # the block gave the lock back itself
        entered_cancelling = hold.entries.pop()
        ours = False
        if hold.cancelled_owner:
            # As asyncio.timeout() does: only our own cancellation becomes LockLost.
            hold.cancelled_owner = False
            remaining = task.uncancel()
            ours = exc_type is asyncio.CancelledError and remaining <= entered_cancelling
        try:
            await self._bg.shielded(self._release(hold))
        except LockLost:
            if ours or exc_type is None:
                raise LockLost(self.name) from exc
            return  # another exception is already leaving the block
        except Exception:
            # Nobody can retry the release of an async with: were the hold kept,
            # its watchdog would renew it for as long as the task lives.
            self._abandon(hold)
            raise
        if ours:  # defensive: we cancel only lost holds, and their release raises
            raise LockLost(self.name) from exc

    def _ensure_watchdog(self, hold: Hold[R]) -> None:
        """Start the hold's watchdog unless it runs (called by its timer, and after a
        failed final release, which may have ended the watchdog)."""
        if hold.live and (hold.watchdog is None or hold.watchdog.done()):
            hold.watchdog = self._bg.spawn(self._watchdog.watch(hold))


class _Entry(Generic[R]):
    """The context manager returned by ``lock(wait=...)``."""

    __slots__ = ("_lock", "_wait")

    def __init__(self, lock: BaseLock[R], wait: float | None) -> None:
        self._lock = lock
        self._wait = wait

    async def __aenter__(self) -> BaseLock[R]:
        await self._lock._enter(self._wait)
        return self._lock

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._lock._exit(exc_info[0], exc_info[1])
