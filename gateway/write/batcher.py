"""Per-sku batching of reserved purchases into one database flush.

Purchases that survived the Redis reservation wait here for their sku's flush.
One flush per sku runs at a time in this process and the next batch fills
behind it, so batches grow with the load on their own (natural batching, the
default: ``batch_wait`` 0). With a ``batch_wait``, a batch also waits until
it reaches ``batch_max`` or its oldest entry has waited that long, but not at
all when, at the backlog's recent pace of arrivals, no other purchase is due
within the wait (a lone buyer is not kept waiting for nobody). When a sku's
backlog runs empty the flusher hears of it (``on_empty``): advice, whose failure
is logged and never ends the backlog (a backlog's task that died would leave its sku
reserving and never flushing, for good). The flusher may keep the sku's lock
a while through an empty backlog; it says how long, and the backlog calls again
then if nothing arrived, so that the lock is let go in the backlog's own task.

A batch waits for the purchases of its sku already on their way
(``on_the_way``: reservations in flight to Redis, whose buyers join the backlog
as soon as Redis answers), at most ``landing_s`` (:data:`LANDING_S`). A
closed loop of buyers answered together comes back together, but over a few
loop turns, so over a few reserve calls: without the wait the first call's
purchases flush alone and the others wait a whole flush behind them.
The backlog, every sku's purchases waiting for or in a flush, is bounded
(``backlog_max``): past it :attr:`Batcher.full` tells the caller to shed.
Closing stops new submissions and drains the backlog: a closing batcher is
what "draining" means for the whole instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import structlog

from gateway.domain.errors import ShuttingDown
from gateway.domain.model import Purchase, Result
from gateway.write.pace import averaged

# Flushes one sku's batch; returns one result or exception per purchase, in order.
FlushFn = Callable[[str, Sequence[Purchase]], Awaitable[Sequence[Result | BaseException]]]


class AfterEmpty(Enum):
    """What a sku's backlog does once it ran empty, as its flusher hears it."""

    # It waits for arrivals: the flusher may keep the sku's lock a while.
    WAIT = "wait"
    # It ends (closing), or nothing waits (a stream's writer): the lock goes now.
    END = "end"


# Told that a sku's backlog has nothing left to flush, and what the backlog does
# next; returns for how long the flusher keeps the sku's lock if nothing arrives
# (the backlog calls again then), or None.
EmptyFn = Callable[[str, AfterEmpty], Awaitable[float | None]]
# The calls in flight whose purchases of a sku will reach its backlog (empty: they
# go out this loop turn), or None when none are on their way.
OnTheWay = Callable[[str], Sequence["asyncio.Future[Any]"] | None]


async def _no_flusher_lock(sku: str, after: AfterEmpty) -> None:
    """No flusher to tell: nothing to keep."""


def _none_on_the_way(sku: str) -> None:
    """Nothing reserves ahead of the backlog."""


log = structlog.get_logger(__name__)

# Longest a batch waits for purchases on their way, and in how many steps: a
# few reserve calls' round trips under a storm (docs/performance.md).
LANDING_S = 0.005
LANDING_STEPS = 4


@dataclass(slots=True)
class _SkuBacklog:
    """One sku's backlog and its flusher task."""

    sku: str
    entries: list[tuple[Purchase, asyncio.Future[Result]]] = field(default_factory=list)
    first_at: float = 0.0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    full: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    # Arrivals: when the last one came, and a moving average of the gaps
    # between them (seconds), from which the batch wait is decided.
    last_at: float = 0.0
    gap: float = float("inf")


class Batcher:
    """Collects reserved purchases per sku and flushes them in batches."""

    def __init__(
        self,
        flush: FlushFn,
        *,
        batch_max: int,
        batch_wait_s: float,
        backlog_max: int,
        on_empty: EmptyFn = _no_flusher_lock,
        on_the_way: OnTheWay = _none_on_the_way,
        landing_s: float = LANDING_S,
    ) -> None:
        self._flush = flush
        self._on_empty = on_empty
        self._on_the_way = on_the_way
        self._landing_s = landing_s
        self._max = batch_max
        self._wait = batch_wait_s
        self._backlog_max = backlog_max
        self._skus: dict[str, _SkuBacklog] = {}
        self._total = 0
        self._closed = False

    @property
    def backlog(self) -> int:
        """The backlog: purchases waiting for or in a flush, across all skus."""
        return self._total

    @property
    def closing(self) -> bool:
        """Whether closing has begun: the instance is draining."""
        return self._closed

    @property
    def full(self) -> bool:
        """Whether a new purchase should be shed instead of reserved."""
        return self._closed or self._total >= self._backlog_max

    async def submit(self, purchase: Purchase) -> Result:
        """Add a reserved purchase to its sku's backlog and wait for its flush's result.

        Raises :class:`ShuttingDown` once closing has begun, or with the flush's
        own error. Cancelling the wait does not withdraw the purchase: it is
        reserved, so it is flushed and settled regardless.
        """
        return await self.add(purchase)

    def add(self, purchase: Purchase) -> asyncio.Future[Result]:
        """Add a reserved purchase to its sku's backlog; the future of its flush's
        result (:meth:`submit` without a coroutine, for the host's lanes)."""
        if self._closed:
            raise ShuttingDown()
        backlog = self._skus.get(purchase.sku)
        if backlog is None:
            backlog = self._skus[purchase.sku] = _SkuBacklog(purchase.sku)
            # A fresh context: the flusher must not carry the first request's log bindings.
            backlog.task = asyncio.create_task(
                self._run(backlog), name=f"flush:{purchase.sku}", context=contextvars.Context()
            )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        now = loop.time()
        backlog.gap = _next_gap(backlog.gap, now - backlog.last_at, self._wait)
        backlog.last_at = now
        if not backlog.entries:
            backlog.first_at = now
            backlog.arrived.set()
        backlog.entries.append((purchase, future))
        self._total += 1
        if len(backlog.entries) >= self._max:
            backlog.full.set()
        return future

    async def close(self) -> None:
        """Refuse new purchases, flush the backlog, and stop the flushers."""
        self._closed = True
        for backlog in self._skus.values():
            backlog.arrived.set()
            backlog.full.set()
        tasks = [backlog.task for backlog in self._skus.values() if backlog.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    def abort(self) -> None:
        """Stop every flusher now, after :meth:`close` ran out of time.

        Whatever was not committed stays reserved in the Redis ledger, as after a
        crash, and the reconciler settles it from the order rows.
        """
        self._closed = True
        for backlog in self._skus.values():
            if backlog.task is not None:
                backlog.task.cancel()
            for _, future in backlog.entries:
                if not future.done():
                    future.set_exception(ShuttingDown())
            self._total -= len(backlog.entries)
            backlog.entries.clear()

    async def _run(self, backlog: _SkuBacklog) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not backlog.entries:
                if not await self._empty(backlog):
                    return
                continue
            remaining = self._wait - (loop.time() - backlog.first_at)
            # Wait only for a batch that will fill: when, at the recent pace,
            # another purchase is due before the wait is over. A lone buyer is
            # flushed at once; under a storm batches fill (and while a flush
            # runs the next batch fills behind it anyway).
            if remaining < backlog.gap:
                remaining = 0.0
            if len(backlog.entries) < self._max and remaining > 0 and not self._closed:
                backlog.full.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await backlog.full.wait()
            if len(backlog.entries) < self._max and not self._closed:
                await self._landing(backlog)
            batch = backlog.entries[: self._max]
            del backlog.entries[: self._max]
            backlog.first_at = loop.time()
            await self._flush_batch(backlog.sku, batch)

    async def _empty(self, backlog: _SkuBacklog) -> bool:
        """The backlog ran empty: tell the flusher, then wait for an arrival, or
        until the flusher asks to be told again. False when the backlog ends."""
        keep = await self._emptied(backlog.sku)
        if backlog.entries:  # arrived while the flusher settled
            return True
        if self._closed:
            return keep is not None  # the flusher lets go first
        backlog.arrived.clear()
        if keep is None:
            await backlog.arrived.wait()
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(keep):
                await backlog.arrived.wait()
        return True

    async def _landing(self, backlog: _SkuBacklog) -> None:
        """Let the purchases of the backlog's sku on their way join its batch."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._landing_s
        for _ in range(LANDING_STEPS):
            calls = self._on_the_way(backlog.sku)
            left = deadline - loop.time()
            if calls is None or left <= 0 or len(backlog.entries) >= self._max:
                return
            if calls:
                # Their purchases join the backlog before this wakes (see on_the_way).
                await asyncio.wait(calls, timeout=left)
            else:
                await asyncio.sleep(0)  # sent at the end of this turn

    async def _emptied(self, sku: str) -> float | None:
        try:
            return await self._on_empty(sku, AfterEmpty.END if self._closed else AfterEmpty.WAIT)
        except Exception as exc:
            # A lock release that failed in an unforeseen way (a Redis failover
            # raised one that nobody typed) must not end the backlog.
            log.error("backlog_empty_failed", sku=sku, cause=repr(exc), exc_info=exc)
            return None

    async def _flush_batch(
        self, sku: str, batch: list[tuple[Purchase, asyncio.Future[Result]]]
    ) -> None:
        try:
            results = await self._flush(sku, [p for p, _ in batch])
        except Exception as exc:  # the flush answers every purchase, whatever failed
            results = [exc] * len(batch)
        except asyncio.CancelledError:  # aborted: the reconciler settles these
            for _, future in batch:
                if not future.done():
                    future.set_exception(ShuttingDown())
            raise
        finally:
            self._total -= len(batch)
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)


def _next_gap(average: float, gap: float, wait: float) -> float:
    """The moving average of a backlog's gaps between arrivals after one more ``gap``.

    A gap longer than the wait counts as the wait: a quiet minute must not take
    a storm many arrivals to forget, and one arrival within the wait after a
    lone one is enough to make batches wait again.
    """
    return averaged(average, min(gap, wait))
