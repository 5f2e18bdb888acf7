"""The flush: commit a sku's batch in PostgreSQL under its lock, then settle Redis.

The batcher hands each batch to :meth:`Flusher.flush`, which holds the sku's
flush lock, makes one ``flush_batch()`` call (``Orders.commit_batch``) and
settles the reservations with ``settle.lua`` (``Reservations.settle``). It keeps
the lock for at most :data:`HOLD_SLICE_S` an acquisition across back-to-back
flushes, and through its sku's backlog running empty (:meth:`Flusher.emptied`) when
at the backlog's recent pace its next flush is due within the slice: a closed
loop of buyers runs the backlog empty after every flush and refills it a few ms
later, and taking the lock anew each time put a Redis round trip before every
commit (kept, one process sells more in stock at less CPU a purchase:
docs/performance.md, "the lock kept through a closed loop's gaps"). A backlog that
stays empty twice its recent gap lets go. Another instance, an admin change
or the reconciler waits at most that, and at most the slice under a backlog.
Every failure before the commit gives the reservations back; nothing
committed is ever undone.

The buyers of a batch are answered once it is committed, while it settles: a
committed order is the truth whatever the ledger says, and a closed-loop buyer
sends its next request a Redis round trip sooner (more requests a second in
stock at less CPU each: docs/performance.md, "Answers before the settle"). The
settle still ends before the sku's next flush or its lock is let go, both in
the backlog's task, so the ledger and the database stock it compares still come
from one moment under the lock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Protocol

import structlog
from redis.exceptions import RedisError

from gateway.domain.errors import FencedOut, OutcomeUnknown, Unavailable
from gateway.domain.events import FirstEvents
from gateway.domain.model import Purchase, Result, Verdict
from gateway.domain.stock import Settlement
from gateway.lock import LockError, LockLost, LockTimeout
from gateway.postgres.orders import BatchDecision, Orders
from gateway.redis.reservations import Reservations
from gateway.write.batcher import AfterEmpty
from gateway.write.pace import averaged
from gateway.write.sku_locks import FlushLock, SkuLocks

log = structlog.get_logger(__name__)

# Longest a sku's flusher keeps its lock across back-to-back flushes.
HOLD_SLICE_S = 0.05
# An empty backlog keeps its lock this many times its recent gap between running
# empty and flushing again (when that fits in the slice).
LINGER_GAPS = 2.0

# A flush fenced out or whose lock was lost is retried this many times under a
# fresh acquisition before its purchases are answered 503 and released.
FLUSH_ATTEMPTS = 3

# The failure reasons (see _reason) that say Redis, or the lock kept there,
# failed under a flush: writes may have been lost (a failover).
REDIS_REASONS = frozenset({"redis", "lock_lost", "lock_unavailable"})
# The failures a flush expects (an outage, a lost lock): logged by their cause,
# without a traceback; anything else is the reason "error".
EXPECTED = (LockError, RedisError, Unavailable)


class Answer(Enum):
    """When :meth:`Flusher.commit` returns, against the batch's settle."""

    # Once the batch is committed and settled (the queue's writers).
    AFTER_SETTLE = "after_settle"
    # Once committed: the buyers hear sooner, and the settle runs until the
    # sku's next flush or its backlog running empty waits for it (the batcher).
    BEFORE_SETTLE = "before_settle"


class FlushObserver(Protocol):
    """What the metrics want to know of the flushes (see gateway.ops.metrics)."""

    def flushed(self, size: int, seconds: float) -> None: ...
    def flush_failed(self, reason: str) -> None: ...
    def fenced_out(self) -> None: ...


class HandingOff(Protocol):
    """Takes a flush's new orders, whose first events this gateway appends
    itself (gateway.usecases.handoff.HandOff)."""

    @property
    def sink(self) -> str | None:
        """The sink the flush hands them to; None: no hand-off."""

    def give(self, flush: FirstEvents) -> None:
        """A committed flush's new orders."""


class _NoHandOff:
    """No hand-off: the relay delivers every event."""

    sink = None

    def give(self, flush: FirstEvents) -> None:
        """Never asked for."""


NO_HANDOFF: HandingOff = _NoHandOff()


def _unheard() -> None:
    """A Redis failure nobody is told of."""


class _Unobserved:
    """Flushes nobody counts."""

    def flushed(self, size: int, seconds: float) -> None:
        """Nothing to count."""

    def flush_failed(self, reason: str) -> None:
        """Nothing to count."""

    def fenced_out(self) -> None:
        """Nothing to count."""


UNOBSERVED = _Unobserved()


class Flusher:
    """Commits and settles batches, one sku at a time per caller, under the sku's lock."""

    def __init__(
        self,
        *,
        reservations: Reservations,
        orders: Orders,
        locks: SkuLocks,
        observer: FlushObserver = UNOBSERVED,
        on_redis_failure: Callable[[], None] = _unheard,
        handoff: HandingOff = NO_HANDOFF,
    ) -> None:
        self._reservations = reservations
        self._orders = orders
        self._locks = locks
        self._observer = observer
        self._handoff = handoff
        # Told when Redis fails under a flush, a settle, a give-back or a lock
        # release (gateway.usecases.doubt.RedisDoubt.failed).
        self._on_redis_failure = on_redis_failure
        # Skus whose flusher holds the flush lock now, with when it took it.
        self._holding: dict[str, float] = {}
        # Skus whose last batch is settling after its buyers were answered.
        self._settling: dict[str, asyncio.Future[bool]] = {}
        # Skus whose backlog ran empty, since when; and the moving average of
        # each sku's gaps from running empty to flushing again (seconds).
        self._empty_since: dict[str, float] = {}
        self._gap: dict[str, float] = {}

    async def flush(self, sku: str, batch: Sequence[Purchase]) -> list[Result | BaseException]:
        """Commit a batch and settle its reservations; one result per purchase."""
        started = time.perf_counter()
        try:
            decision = await self.commit(sku, batch, answer=Answer.BEFORE_SETTLE)
        except Exception as exc:
            return await self._failed(sku, batch, exc)
        self._observer.flushed(len(batch), time.perf_counter() - started)
        return [decision.decisions[p.request_id].result for p in batch]

    async def commit(
        self, sku: str, batch: Sequence[Purchase], *, answer: Answer = Answer.AFTER_SETTLE
    ) -> BatchDecision:
        """Commit a batch under the sku's lock and settle it; what was decided.

        With ``Answer.BEFORE_SETTLE`` it returns once committed, and the settle
        runs until the sku's next flush or :meth:`emptied` waits for it.
        A fenced-out flush or a lost lock is retried under a fresh acquisition.
        Raises the last failure, and gives nothing back: :meth:`flush` does for
        the batcher, while the queue's writers keep the purchases queued.
        """
        empty_since = self._empty_since.pop(sku, None)
        if empty_since is not None:
            gap = time.monotonic() - empty_since
            self._gap[sku] = averaged(self._gap.get(sku, float("inf")), gap)
        failure: Exception = Unavailable("flush failed")
        for _ in range(FLUSH_ATTEMPTS):
            try:
                return await self._flush_once(sku, batch, answer)
            except FencedOut as exc:
                self._observer.fenced_out()
                failure = exc
            except LockLost as exc:
                failure = exc
        raise failure

    async def give_back(self, sku: str, batch: Sequence[Purchase]) -> None:
        """Release reservations that will not be flushed: stock and buyers go back."""
        released = [Settlement(p.request_id, Verdict.RELEASED, p.user_id, p.qty) for p in batch]
        try:
            await self._reservations.settle(sku, released, None)
        except Unavailable as exc:
            self._on_redis_failure()
            log.warning("give_back_failed", sku=sku, size=len(batch), cause=str(exc))

    async def emptied(self, sku: str, after: AfterEmpty = AfterEmpty.END) -> float | None:
        """The sku's backlog ran empty: settle its last batch and let other
        instances have the lock. When the backlog waits (``AfterEmpty.WAIT``) the
        lock is kept when, at the backlog's recent pace, its next flush is due
        within the slice: then the answer is how long (the backlog calls again
        then if nothing arrived, and the lock is let go); else None. In the
        backlog's task: the lock is its own."""
        again = sku in self._empty_since  # still empty since the last call
        self._empty_since.setdefault(sku, time.monotonic())
        await self._settled(sku)
        now = time.monotonic()
        lock = self._locks.get(sku)
        if lock is None:
            return None
        taken = self._holding.get(sku)
        waits = after is AfterEmpty.WAIT
        if waits and not again and taken is not None and not lock.lost.is_set():
            # No gap measured yet (inf): nothing says the next flush is due.
            keep = LINGER_GAPS * self._gap.get(sku, float("inf"))
            if keep < HOLD_SLICE_S - (now - taken):
                return keep
        await self._let_go(sku, lock)
        return None

    async def _failed(
        self, sku: str, batch: Sequence[Purchase], failure: Exception
    ) -> list[Result | BaseException]:
        reason = _reason(failure)
        self._observer.flush_failed(reason)
        if reason in REDIS_REASONS:
            self._on_redis_failure()
        # An unexpected error gets its traceback; an expected outage its cause.
        log.warning(
            "flush_failed",
            sku=sku,
            size=len(batch),
            reason=reason,
            cause=repr(failure),
            exc_info=None if isinstance(failure, EXPECTED) else failure,
        )
        if not isinstance(failure, OutcomeUnknown):
            await self.give_back(sku, batch)
        answer = failure if isinstance(failure, Unavailable) else Unavailable(reason)
        return [answer] * len(batch)

    async def _flush_once(
        self, sku: str, batch: Sequence[Purchase], answer: Answer
    ) -> BatchDecision:
        await self._settled(sku)
        lock = self._locks.get(sku)
        if lock is None:
            unlocked = await self._commit(sku, batch, None)
            await self._settle(sku, batch, unlocked)
            return unlocked
        await self._hold(sku, lock)
        decision: BatchDecision | None = None
        try:
            decision = await self._commit(sku, batch, lock.fence)
            if answer is Answer.BEFORE_SETTLE:
                self._settling[sku] = asyncio.ensure_future(self._settle_held(sku, batch, decision))
                return decision
            # Settled under the lock, so the ledger and the database stock it
            # compares come from one moment.
            await self._settle(sku, batch, decision)
        except Exception as exc:
            # Whatever failed, the next flush starts from a fresh acquisition.
            await self._let_go(sku, lock)
            if decision is None:
                raise
            # Committed: what fails now changes nothing that was decided, and
            # the buyers must hear about their orders.
            log.warning("lock_after_commit", sku=sku, cause=repr(exc))
            return decision
        if time.monotonic() - self._holding.get(sku, 0.0) >= HOLD_SLICE_S:
            await self._let_go(sku, lock)
        return decision

    async def _commit(
        self, sku: str, batch: Sequence[Purchase], fence: int | None
    ) -> BatchDecision:
        """One ``flush_batch()`` call; its new orders' first events handed off."""
        decision = await self._orders.commit_batch(sku, batch, fence, self._handoff.sink)
        if decision.handed is not None:
            self._handoff.give(decision.handed)
        return decision

    async def _settle_held(
        self, sku: str, batch: Sequence[Purchase], decision: BatchDecision
    ) -> bool:
        """Settle a batch whose buyers have their answers; whether the lock can
        be kept (anything but Redis being down failing means it cannot)."""
        try:
            await self._settle(sku, batch, decision)
        except Exception as exc:
            log.warning("lock_after_commit", sku=sku, cause=repr(exc))
            return False
        return True

    async def _settled(self, sku: str) -> None:
        """Wait for the sku's last settle, then let go of its lock if that
        failed or the slice is over. In the backlog's task: the lock is its own."""
        settling = self._settling.pop(sku, None)
        if settling is None:
            return
        kept = await settling
        lock = self._locks.get(sku)
        if lock is not None and (
            not kept or time.monotonic() - self._holding.get(sku, 0.0) >= HOLD_SLICE_S
        ):
            await self._let_go(sku, lock)

    async def _hold(self, sku: str, lock: FlushLock) -> None:
        """Make sure this sku's flusher holds its lock, acquiring it if need be.

        The lock stays with the flusher across back-to-back flushes (at most
        HOLD_SLICE_S, then other instances get their turn): under a storm each
        acquisition would otherwise cost a round trip per flush. The fencing
        token in the flush's UPDATE still rejects a holder whose lease ran out.
        """
        if sku in self._holding:
            if not lock.lost.is_set():
                return
            await self._let_go(sku, lock)
        if not await lock.acquire(wait=self._locks.wait_s):
            raise LockTimeout(sku, "flush lock not acquired in time")
        self._holding[sku] = time.monotonic()

    async def _let_go(self, sku: str, lock: FlushLock) -> None:
        if self._holding.pop(sku, None) is None:
            return
        try:
            await lock.release()
        except Exception as exc:
            # Lost, unreachable, or failed in a way nobody typed (a failover):
            # stop renewing either way, and the lease runs out on its own.
            lock.abandon()
            self._on_redis_failure()
            log.warning("lock_release_failed", sku=sku, cause=repr(exc))

    async def _settle(self, sku: str, batch: Sequence[Purchase], decision: BatchDecision) -> None:
        settlements = []
        for p in batch:
            d = decision.decisions[p.request_id]
            order = d.result.order if isinstance(d.result, Result) else None
            order_id = order.order_id if order is not None else ""
            settlements.append(Settlement(p.request_id, d.verdict, p.user_id, p.qty, order_id))
        try:
            await self._reservations.settle(sku, settlements, decision.short_stock_after)
        except Unavailable as exc:
            # Committed all the same: the reconciler settles the ledger later.
            self._on_redis_failure()
            log.warning("settle_failed", sku=sku, size=len(batch), cause=str(exc))


def _reason(exc: BaseException) -> str:
    """A short label of why a flush failed, for logs and metrics."""
    if isinstance(exc, LockLost):
        return "lock_lost"
    if isinstance(exc, LockError):
        return "lock_unavailable"
    if isinstance(exc, RedisError):
        return "redis"
    if isinstance(exc, Unavailable):
        return exc.reason
    return "error"  # not EXPECTED
