"""Per-sku batching of reserved purchases into database flushes.

Purchases that survived the Redis reservation wait here for their sku's flush.
Each sku has a lane: a task that sends its batches and lands them, in order.
Given a :class:`Pipeline` (``gateway.write.flights``), a lane keeps up to two
flushes of its sku in flight, the next batch going out while the last one
commits; given a plain flush function, one at a time. Either way the next batch
fills behind what is in flight, so batches grow with the load on their own
(natural batching, the default: ``batch_wait`` 0). With a ``batch_wait``, a
batch is also held until it reaches ``batch_max`` or its oldest entry has
waited that long, but not at all when, at the lane's recent pace of arrivals,
no other purchase is due within the wait (a lone buyer is not kept waiting for
nobody). When a sku's lane runs empty, with nothing in flight, the flusher
hears of it (``on_idle``): advice, whose failure is logged and never ends the
lane (a lane's task that died would leave its sku reserving and never
flushing, for good).
The backlog, every sku's purchases waiting for or in a flush, is bounded
(``backlog_max``): past it :attr:`Batcher.full` tells the caller to shed.
Closing stops new submissions and drains what is queued: a closing batcher is
what "draining" means for the whole instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import structlog

from gateway.domain.errors import ShuttingDown
from gateway.domain.model import Purchase, Result

# Flushes one sku's batch; returns one result or exception per purchase, in order.
FlushFn = Callable[[str, Sequence[Purchase]], Awaitable[Sequence[Result | BaseException]]]
# Told that a sku's lane has nothing left to flush.
IdleFn = Callable[[str], Awaitable[None]]
# A purchase's place in a batch: the purchase and the future its buyer awaits.
Entry = tuple[Purchase, "asyncio.Future[Result]"]


class Flight(Protocol):
    """A batch on its way (``gateway.write.flights.Flight``)."""

    @property
    def commit(self) -> asyncio.Future[Any]:
        """Done once the batch's commit has finished, whatever its outcome."""


F = TypeVar("F", bound=Flight)


@runtime_checkable
class Pipeline(Protocol[F]):
    """Flushes sent and landed by a lane, in order (``gateway.write.flights.Flights``)."""

    def room(self, sku: str) -> bool:
        """Whether another flight of ``sku`` may go out while one is in flight."""

    async def send(self, sku: str, batch: Sequence[Purchase]) -> F:
        """Start a batch's flush; never raises (a failure is the flight's)."""

    async def land(self, flight: F) -> Sequence[Result | BaseException]:
        """Finish the oldest flight; one result or exception per purchase."""

    def abandon(self, flights: Sequence[F]) -> None:
        """Stop flights that will never land."""


log = structlog.get_logger(__name__)

# Weight of the newest gap between arrivals in a lane's moving average.
GAP_WEIGHT = 0.25


@dataclass(slots=True)
class _Lane:
    """One sku's backlog and its flusher task."""

    sku: str
    entries: list[Entry] = field(default_factory=list)
    first_at: float = 0.0
    # Set when the lane may have something to do: a first arrival, a full
    # batch, a commit finished, closing.
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    # The size at which the waiting batch wakes the lane: the newest flight's.
    fill_to: int = 0
    # Flights sent and not yet landed, oldest first, with their buyers' futures.
    flights: deque[tuple[Any, list[asyncio.Future[Result]]]] = field(default_factory=deque)
    # Arrivals: when the last one came, and a moving average of the gaps
    # between them (seconds), from which the batch wait is decided.
    last_at: float = 0.0
    gap: float = float("inf")


class Batcher:
    """Collects reserved purchases per sku and flushes them in batches."""

    def __init__(
        self,
        flush: FlushFn | Pipeline[Any],
        *,
        batch_max: int,
        batch_wait_s: float,
        backlog_max: int,
        on_idle: IdleFn | None = None,
    ) -> None:
        self._pipeline: Pipeline[Any] = flush if isinstance(flush, Pipeline) else _Serial(flush)
        self._on_idle = on_idle
        self._max = batch_max
        self._wait = batch_wait_s
        self._backlog_max = backlog_max
        self._lanes: dict[str, _Lane] = {}
        self._backlog = 0
        self._closed = False

    @property
    def backlog(self) -> int:
        """The backlog: purchases waiting for or in a flush, across all skus."""
        return self._backlog

    @property
    def closing(self) -> bool:
        """Whether closing has begun: the instance is draining."""
        return self._closed

    @property
    def full(self) -> bool:
        """Whether a new purchase should be shed instead of reserved."""
        return self._closed or self._backlog >= self._backlog_max

    async def submit(self, purchase: Purchase) -> Result:
        """Add a reserved purchase to its sku's lane and wait for its flush's result.

        Raises :class:`ShuttingDown` once closing has begun, or with the flush's
        own error. Cancelling the wait does not withdraw the purchase: it is
        reserved, so it is flushed and settled regardless.
        """
        if self._closed:
            raise ShuttingDown()
        lane = self._lanes.get(purchase.sku)
        if lane is None:
            lane = self._lanes[purchase.sku] = _Lane(purchase.sku)
            # A fresh context: the flusher must not carry the first request's log bindings.
            lane.task = asyncio.create_task(
                self._run(lane), name=f"flush:{purchase.sku}", context=contextvars.Context()
            )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        now = loop.time()
        lane.gap = _next_gap(lane.gap, now - lane.last_at, self._wait)
        lane.last_at = now
        if not lane.entries:
            lane.first_at = now
            lane.wake.set()
        lane.entries.append((purchase, future))
        self._backlog += 1
        if len(lane.entries) == lane.fill_to or len(lane.entries) >= self._max:
            lane.wake.set()
        return await future

    async def close(self) -> None:
        """Refuse new purchases, flush every queued one, and stop the flushers."""
        self._closed = True
        for lane in self._lanes.values():
            lane.wake.set()
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    def abort(self) -> None:
        """Stop every flusher now, after :meth:`close` ran out of time.

        Whatever was not committed stays reserved in the Redis ledger, as after a
        crash, and the reconciler settles it from the order rows.
        """
        self._closed = True
        for lane in self._lanes.values():
            if lane.task is not None:
                lane.task.cancel()
            for _, future in lane.entries:
                if not future.done():
                    future.set_exception(ShuttingDown())
            self._backlog -= len(lane.entries)
            lane.entries.clear()

    async def _run(self, lane: _Lane) -> None:
        try:
            while await self._step(lane):
                pass
        except asyncio.CancelledError:  # aborted: the reconciler settles these
            self._pipeline.abandon([flight for flight, _ in lane.flights])
            for _, futures in lane.flights:
                _answer(futures, [ShuttingDown()] * len(futures))
                self._backlog -= len(futures)
            lane.flights.clear()
            raise

    async def _step(self, lane: _Lane) -> bool:
        """One move of a lane: send a batch, land a flight, or wait for either.

        Sending comes first, so the next batch is on its way while the last one
        settles. False once the batcher is closing and the lane has run empty.
        """
        delay = 0.0
        if lane.entries and self._may_send(lane):
            delay = self._hold_back(lane)
            if delay <= 0:
                await self._send(lane)
                return True
        if lane.flights and lane.flights[0][0].commit.done():
            await self._land(lane)
            return True
        if not lane.entries and not lane.flights:
            if self._on_idle is not None:
                await self._idle(lane.sku)
                if lane.entries:  # arrived while the flusher let go
                    return True
            if self._closed:
                return False
        lane.wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay if delay > 0 else None):
                await lane.wake.wait()
        return True

    def _may_send(self, lane: _Lane) -> bool:
        """Whether the lane's waiting batch may go out now.

        With a flight in flight, the next one goes out once its batch is as big
        as that flight's (each flight costs the row a round trip and a commit,
        and a small one sent early would take the second place from the batch
        filling behind it), or as soon as that flight's commit has finished.
        """
        if not lane.flights:
            return True
        newest, futures = lane.flights[-1]
        return self._pipeline.room(lane.sku) and (
            newest.commit.done() or len(lane.entries) >= min(self._max, len(futures))
        )

    def _hold_back(self, lane: _Lane) -> float:
        """How long the lane's next batch may still wait to fill (0: send it now).

        Only a batch that will fill waits: when, at the recent pace, another
        purchase is due before the wait is over. A lone buyer is flushed at
        once; under a storm batches fill behind what is in flight anyway.
        """
        if self._closed or len(lane.entries) >= self._max:
            return 0.0
        remaining = self._wait - (asyncio.get_running_loop().time() - lane.first_at)
        return 0.0 if remaining < lane.gap else remaining

    async def _send(self, lane: _Lane) -> None:
        batch = lane.entries[: self._max]
        del lane.entries[: self._max]
        lane.first_at = asyncio.get_running_loop().time()
        flight = await self._pipeline.send(lane.sku, [p for p, _ in batch])
        lane.flights.append((flight, [future for _, future in batch]))
        lane.fill_to = len(batch)
        flight.commit.add_done_callback(lambda _: lane.wake.set())

    async def _land(self, lane: _Lane) -> None:
        flight, futures = lane.flights[0]
        try:
            results = await self._pipeline.land(flight)
        except Exception as exc:  # the flush answers every purchase, whatever failed
            results = [exc] * len(futures)
        lane.flights.popleft()
        self._backlog -= len(futures)
        _answer(futures, results)

    async def _idle(self, sku: str) -> None:
        assert self._on_idle is not None
        try:
            await self._on_idle(sku)
        except Exception as exc:
            # A lock release that failed in an unforeseen way (a Redis failover
            # raised one that nobody typed) must not end the lane.
            log.error("lane_idle_failed", sku=sku, cause=repr(exc), exc_info=exc)


@dataclass(slots=True)
class _SerialFlight:
    """A batch for a plain flush function: it is flushed when it lands."""

    sku: str
    batch: Sequence[Purchase]
    commit: asyncio.Future[None]


class _Serial:
    """A plain flush function as a pipeline of one flight at a time."""

    def __init__(self, flush: FlushFn) -> None:
        self._flush = flush

    def room(self, sku: str) -> bool:
        return False

    async def send(self, sku: str, batch: Sequence[Purchase]) -> _SerialFlight:
        ready = asyncio.get_running_loop().create_future()
        ready.set_result(None)
        return _SerialFlight(sku, batch, ready)

    async def land(self, flight: _SerialFlight) -> Sequence[Result | BaseException]:
        return await self._flush(flight.sku, flight.batch)

    def abandon(self, flights: Sequence[_SerialFlight]) -> None:
        """Nothing runs before a serial flight lands."""


def _answer(
    futures: Sequence[asyncio.Future[Result]], results: Sequence[Result | BaseException]
) -> None:
    """Hand each buyer its result; a buyer who stopped waiting is skipped."""
    for future, result in zip(futures, results, strict=True):
        if future.done():
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)


def _next_gap(average: float, gap: float, wait: float) -> float:
    """The moving average of a lane's gaps between arrivals after one more ``gap``.

    A gap longer than the wait counts as the wait: a quiet minute must not take
    a storm many arrivals to forget, and one arrival within the wait after a
    lone one is enough to hold batches again.
    """
    gap = min(gap, wait)
    if average == float("inf"):
        return gap
    return average + GAP_WEIGHT * (gap - average)
