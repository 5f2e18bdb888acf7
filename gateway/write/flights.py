"""Two flushes of a sku in flight: the next batch's commit queues behind the last one's.

A flush is one round trip to PostgreSQL, then a settle in Redis, then the
answers. Flushed one at a time, the sku's row sits idle from one commit to the
next while this process reads the reply, settles, answers and sends the next
batch, each step waiting for the event loop's turn among the requests it
serves. With :data:`DEPTH` flushes in flight, the next batch is already queued
on the row's lock in PostgreSQL when the last one commits.

A flight is sent and landed by its sku's lane (the batcher's task for the sku):
:meth:`Flights.send` takes the flush lock in that task and starts the commit
with the hold's fencing token in a task of its own (a lock's holder is a task,
and the commit needs only the token); :meth:`Flights.land` waits for the commit,
settles and answers, in the order the flights were sent. Everything else is the
serial flush's (:class:`Flusher`): the fenced statement, its retries under a
fresh acquisition, the give-back on failure and the settle.

The settles of two flights run in the order they were sent, which PostgreSQL
may not have committed them in: each ``flush_batch()`` waits for the row's lock
and either may have got it first. Settles of batches that found enough stock
commute (their ledger entries are their own). A batch that found the database
short lowers Redis's stock to the database's stock minus what is still pending,
which is right only when every batch committed before it has been settled and
none after it has. So while another flight of its sku is unsettled, a short
batch settles without that ceiling, no new flight goes out, and the last
flight to land applies the ceiling from a fresh read of the database stock,
still under the lock.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import structlog

from gateway.domain.errors import FencedOut, GatewayError
from gateway.domain.model import Purchase, Result
from gateway.lock import LockLost
from gateway.postgres.orders import BatchDecision, Orders
from gateway.write.flusher import FLUSH_ATTEMPTS, Flusher, FlushObserver

log = structlog.get_logger(__name__)

# Flushes of one sku in flight at once: one committing, the next queued behind it.
DEPTH = 2


@dataclass(slots=True, eq=False)
class Flight:
    """One batch on its way: its commit runs as a task until the lane lands it."""

    sku: str
    batch: Sequence[Purchase]
    commit: asyncio.Future[BatchDecision]
    sent_at: float = field(default_factory=time.perf_counter)


class Flights:
    """Sends and lands the flushes of each sku, up to :data:`DEPTH` in flight."""

    def __init__(
        self, flusher: Flusher, orders: Orders, observer: FlushObserver | None = None
    ) -> None:
        self._flusher = flusher
        self._orders = orders
        self._observer = observer
        # Per sku, the flights sent and not yet landed, oldest first.
        self._unlanded: dict[str, deque[Flight]] = {}
        # Skus with a short batch settled without its ceiling: the last flight to
        # land applies it.
        self._ceiling_due: set[str] = set()

    def room(self, sku: str) -> bool:
        """Whether another flight of ``sku`` may go out now."""
        unlanded = self._unlanded.get(sku)
        if not unlanded:
            return True
        return (
            len(unlanded) < DEPTH
            and sku not in self._ceiling_due
            # The lock is handed over only with nothing in flight.
            and not self._flusher.hand_over_due(sku)
        )

    async def send(self, sku: str, batch: Sequence[Purchase]) -> Flight:
        """Take the sku's lock in the calling task and start the batch's commit.

        Never raises: a lock that could not be taken is the flight's failure,
        answered when it lands. The calling task must land it (:meth:`land`).
        """
        loop = asyncio.get_running_loop()
        commit: asyncio.Future[BatchDecision]
        try:
            fence = await self._flusher.hold(sku)
        except Exception as exc:
            commit = loop.create_future()
            commit.set_exception(exc)
        else:
            commit = loop.create_task(self._orders.commit_batch(sku, batch, fence))
        flight = Flight(sku, batch, commit)
        self._unlanded.setdefault(sku, deque()).append(flight)
        return flight

    async def land(self, flight: Flight) -> list[Result | BaseException]:
        """Wait for the oldest flight of its sku to commit, settle it; one result
        per purchase, as :meth:`Flusher.flush` answers them."""
        sku, batch = flight.sku, flight.batch
        assert self._unlanded[sku][0] is flight, "flights land in the order sent"
        try:
            decision = await self._committed(flight)
        except Exception as exc:
            self._unlanded[sku].popleft()
            results = await self._flusher.failed(sku, batch, exc)
            await self._after(sku)
            return results
        try:
            await self._settle(flight, decision)
        except Exception as exc:
            # Committed: the buyers hear of their orders; the reconciler settles.
            log.warning("settle_after_commit_failed", sku=sku, cause=repr(exc))
        self._unlanded[sku].popleft()
        if self._observer is not None:
            self._observer.flushed(len(batch), time.perf_counter() - flight.sent_at)
        await self._after(sku)
        return [decision.decisions[p.request_id].result for p in batch]

    def abandon(self, flights: Sequence[Flight]) -> None:
        """Stop flights that will never land (their lane was cancelled): what they
        reserved stays in the ledger for the reconciler."""
        for flight in flights:
            if flight.commit.done() and not flight.commit.cancelled():
                flight.commit.exception()  # retrieved: nobody will await it
            flight.commit.cancel()
            unlanded = self._unlanded.get(flight.sku)
            if unlanded is not None and flight in unlanded:
                unlanded.remove(flight)

    async def _committed(self, flight: Flight) -> BatchDecision:
        try:
            return await flight.commit
        except (FencedOut, LockLost) as exc:
            failure: Exception = exc
            if isinstance(exc, FencedOut) and self._observer is not None:
                self._observer.fenced_out()
        # Retried as the serial flush retries, once nothing else of the sku is
        # in flight under the hold being given up.
        others = [f.commit for f in self._unlanded[flight.sku] if f is not flight]
        if others:
            await asyncio.wait(others)
        for _ in range(FLUSH_ATTEMPTS - 1):
            await self._flusher.between_flushes(flight.sku, let_go=True)
            try:
                fence = await self._flusher.hold(flight.sku)
                return await self._orders.commit_batch(flight.sku, flight.batch, fence)
            except FencedOut as exc:
                if self._observer is not None:
                    self._observer.fenced_out()
                failure = exc
            except LockLost as exc:
                failure = exc
        raise failure

    async def _settle(self, flight: Flight, decision: BatchDecision) -> None:
        sku = flight.sku
        if decision.short_stock_after is not None and len(self._unlanded[sku]) > 1:
            self._ceiling_due.add(sku)
            decision = replace(decision, short_stock_after=None)
        await self._flusher.settle(sku, flight.batch, decision)

    async def _after(self, sku: str) -> None:
        """After a landing: with nothing left in flight, the ceiling a short batch
        left due, then the lock's hand-over when due."""
        if self._unlanded[sku]:
            return
        if sku in self._ceiling_due:
            self._ceiling_due.discard(sku)
            try:
                stock = await self._orders.stock(sku)
            except GatewayError as exc:
                log.warning("ceiling_read_failed", sku=sku, cause=str(exc))
                stock = None
            if stock is not None:
                await self._flusher.settle(sku, (), BatchDecision({}, stock))
        await self._flusher.between_flushes(sku)
