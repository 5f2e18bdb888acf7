"""The purchase use case: sold-out check, reservation, batching, flush, settle.

A request walks: the in-process sold-out mark, then ``reserve.lua`` in Redis,
then the batcher, whose flush commits the batch in PostgreSQL under the sku's
lock and settles the reservations in Redis. Every failure before the commit
gives the reservation back; nothing confirmed is ever undone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any, Protocol

import structlog
from redis.exceptions import RedisError

from gateway.batcher import Batcher
from gateway.catalog import Catalog
from gateway.domain import DUPLICATE, IN_PROGRESS, SOLD_OUT, Outcome, Purchase, Result
from gateway.errors import InvalidRequest, ShuttingDown, Unavailable
from gateway.inventory import Inventory, Settlement
from gateway.lock.errors import LockError, LockLost, LockTimeout
from gateway.orders import DB_ERRORS, BatchDecision, FencedOut, Orders, OutcomeUnknown
from gateway.soldout import SoldOut

log = structlog.get_logger(__name__)

# Longest a sku's flusher keeps its lock across back-to-back flushes.
HOLD_SLICE_S = 0.05

_ANSWERS = {"sold_out": SOLD_OUT, "duplicate": DUPLICATE, "in_progress": IN_PROGRESS}

# A flush fenced out or whose lock was lost is retried this many times under a
# fresh acquisition before its purchases are answered 503 and released.
FLUSH_ATTEMPTS = 3


class FlushLock(Protocol):
    """The lock a flush holds while it writes its sku's row (see gateway.lock)."""

    @property
    def fence(self) -> int:
        """The fencing token of the current holding."""

    @property
    def lost(self) -> asyncio.Event:
        """Set when the calling task's hold was lost."""

    async def acquire(self, wait: float | None = None) -> bool:
        """Take the lock for the calling task; False when the wait ran out."""

    async def release(self) -> None:
        """Give back the calling task's hold."""

    def abandon(self) -> None:
        """Forget the calling task's hold when its release could not get through."""

    def __call__(self, wait: float | None = None) -> AbstractAsyncContextManager[Any]:
        """Hold the lock for an ``async with`` block, waiting at most ``wait`` seconds."""


class ServiceObserver(Protocol):
    """What the metrics want to know of the service (see gateway.metrics)."""

    def flushed(self, size: int, seconds: float) -> None: ...
    def flush_failed(self, reason: str) -> None: ...
    def fenced_out(self) -> None: ...
    def stock_reloaded(self) -> None: ...
    def shed_one(self) -> None: ...


class PurchaseService:
    """Runs purchases and flushes their batches."""

    def __init__(
        self,
        *,
        inventory: Inventory,
        orders: Orders,
        catalog: Catalog,
        soldout: SoldOut,
        lock_for: Callable[[str], FlushLock] | None,
        lock_wait_s: float,
        batch_max: int,
        batch_wait_s: float,
        queue_max: int,
        observer: ServiceObserver | None = None,
    ) -> None:
        self.inventory = inventory
        self.orders = orders
        self.catalog = catalog
        self.soldout = soldout
        self.lock_for = lock_for
        self.lock_wait = lock_wait_s
        self._observer = observer
        self._reloads: dict[str, asyncio.Future[None]] = {}
        self._marking: dict[str, asyncio.Future[None]] = {}
        # Skus whose flusher holds the flush lock now, with when it took it.
        self._holding: dict[str, float] = {}
        # Set when shutdown begins: new purchases get 503, queued ones finish.
        self.draining = False
        self.batcher = Batcher(
            self.flush, batch_max=batch_max, batch_wait_s=batch_wait_s, queue_max=queue_max
        )

    async def purchase(self, purchase: Purchase) -> Result:
        """Decide one purchase; raises a :class:`GatewayError` for 4xx/503 answers."""
        info = await self.catalog.get(purchase.sku)
        if purchase.qty > info.per_user_limit:
            raise InvalidRequest(f"qty exceeds the per-user limit of {info.per_user_limit}")
        confirmed = self.soldout.lookup(purchase.sku)
        if confirmed is not None:
            order = confirmed.get(purchase.request_id)
            return SOLD_OUT if order is None else Result(Outcome.CONFIRMED, order)
        purchase = purchase.identified()
        structlog.contextvars.bind_contextvars(request_id=purchase.request_id, sku=purchase.sku)
        self._admit()
        generation = self.soldout.generation(purchase.sku)
        purchase = replace(purchase, reserved_at_ms=_now_ms())
        reply = await self.inventory.reserve(purchase)
        if reply.kind == "missing":
            await self._reload(purchase.sku)
            purchase = replace(purchase, reserved_at_ms=_now_ms())
            reply = await self.inventory.reserve(purchase)
        if reply.kind == "ok":
            try:
                return await self.batcher.submit(purchase)
            except ShuttingDown:
                # Draining began while Redis reserved: nothing will flush it here.
                await self._give_back(purchase.sku, [purchase])
                raise
        if reply.kind == "sold_out" and reply.settled:
            await self._once(self._marking, purchase.sku, self._mark_sold_out, generation)
        if reply.kind == "confirmed":
            return Result(Outcome.CONFIRMED, reply.order)
        result = _ANSWERS.get(reply.kind)
        if result is None:
            raise Unavailable("stock not loaded")
        return result

    def _admit(self) -> None:
        """Refuse a purchase before reserving when draining or the queue is full."""
        if self.draining:
            raise ShuttingDown()
        if self.batcher.full:
            if self._observer is not None:
                self._observer.shed_one()
            raise Unavailable("gateway busy")

    async def flush(self, sku: str, batch: Sequence[Purchase]) -> list[Result | BaseException]:
        """Commit a batch and settle its reservations; one result per purchase."""
        started = time.perf_counter()
        failure: Exception = Unavailable("flush failed")
        for _ in range(FLUSH_ATTEMPTS):
            try:
                decision = await self._flush_once(sku, batch)
            except FencedOut:
                if self._observer is not None:
                    self._observer.fenced_out()
                failure = Unavailable("fenced out")
                continue
            except LockLost as exc:
                failure = exc
                continue
            except Exception as exc:
                failure = exc
                break
            if self._observer is not None:
                self._observer.flushed(len(batch), time.perf_counter() - started)
            return [decision.decisions[p.request_id].result for p in batch]
        reason = _reason(failure)
        if self._observer is not None:
            self._observer.flush_failed(reason)
        # An unexpected error gets its traceback; an expected outage its cause.
        log.warning(
            "flush_failed",
            sku=sku,
            size=len(batch),
            reason=reason,
            cause=repr(failure),
            exc_info=failure if reason == "error" else None,
        )
        if not isinstance(failure, OutcomeUnknown):
            await self._give_back(sku, batch)
        answer = failure if isinstance(failure, Unavailable) else Unavailable(reason)
        return [answer] * len(batch)

    async def _flush_once(self, sku: str, batch: Sequence[Purchase]) -> BatchDecision:
        if self.lock_for is None:
            unlocked = await self.orders.commit_batch(sku, batch, None)
            await self._settle(sku, batch, unlocked)
            return unlocked
        lock = self.lock_for(sku)
        await self._hold(sku, lock)
        decision: BatchDecision | None = None
        try:
            decision = await self.orders.commit_batch(sku, batch, lock.fence)
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
        held_for = time.monotonic() - self._holding.get(sku, 0.0)
        if self.batcher.queued(sku) == 0 or held_for >= HOLD_SLICE_S:
            await self._let_go(sku, lock)
        return decision

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
        if not await lock.acquire(wait=self.lock_wait):
            raise LockTimeout(sku, "flush lock not acquired in time")
        self._holding[sku] = time.monotonic()

    async def _let_go(self, sku: str, lock: FlushLock) -> None:
        if self._holding.pop(sku, None) is None:
            return
        try:
            await lock.release()
        except (LockError, RedisError, *DB_ERRORS) as exc:
            # Lost or unreachable: stop renewing, and the lease runs out on its own.
            lock.abandon()
            log.warning("lock_release_failed", sku=sku, cause=repr(exc))

    async def _settle(self, sku: str, batch: Sequence[Purchase], decision: BatchDecision) -> None:
        settlements = []
        for p in batch:
            d = decision.decisions[p.request_id]
            order = d.result.order if isinstance(d.result, Result) else None
            order_id = order.order_id if order is not None else ""
            settlements.append(
                Settlement(p.request_id, d.verdict, p.user_id, p.qty, order_id)  # type: ignore[arg-type]
            )
        try:
            await self.inventory.settle(sku, settlements, decision.short_stock_after)
        except Unavailable as exc:
            # Committed all the same: the reconciler settles the ledger later.
            log.warning("settle_failed", sku=sku, size=len(batch), cause=str(exc))

    async def _give_back(self, sku: str, batch: Sequence[Purchase]) -> None:
        released = [Settlement(p.request_id, "R", p.user_id, p.qty) for p in batch]
        try:
            await self.inventory.settle(sku, released, None)
        except Unavailable as exc:
            log.warning("give_back_failed", sku=sku, size=len(batch), cause=str(exc))

    async def _reload(self, sku: str) -> None:
        """Load a sku's missing stock key from the database, once for all waiters."""
        await self._once(self._reloads, sku, self._load)

    @staticmethod
    async def _once(
        running: dict[str, asyncio.Future[None]],
        sku: str,
        work: Callable[..., Coroutine[Any, Any, None]],
        *args: Any,
    ) -> None:
        """Run ``work(sku, *args)`` unless it already runs for ``sku``; wait for it.

        A storm of requests that all find the same thing missing must cost one
        load, not one per request.
        """
        future = running.get(sku)
        if future is None:
            future = running[sku] = asyncio.ensure_future(work(sku, *args))
            future.add_done_callback(lambda _: running.pop(sku, None))
        await asyncio.shield(future)

    async def _mark_sold_out(self, sku: str, generation: tuple[int, int]) -> None:
        # The confirmed orders come along, so replays are answered in-process.
        self.soldout.mark(sku, generation, await self.inventory.confirmed(sku))

    async def _load(self, sku: str) -> None:
        # Redis may have lost everything of the sku, not just the counter: put
        # the committed orders back first, so replays and repeat buyers are
        # answered from them once the counter reappears.
        await self.inventory.restore_orders(sku, await self.orders.sku_orders(sku))
        stock = await self.orders.stock(sku)
        if stock is None:
            raise Unavailable("sku vanished")
        await self.inventory.load_stock(sku, stock, reset=False)
        if self._observer is not None:
            self._observer.stock_reloaded()
        log.warning("stock_reloaded", sku=sku, stock=stock)

    async def close(self) -> None:
        """Stop taking purchases and drain every queued batch."""
        self.draining = True
        await self.batcher.close()


def _reason(exc: BaseException) -> str:
    """A short label of why a flush failed, for logs and metrics."""
    if isinstance(exc, LockLost):
        return "lock_lost"
    if isinstance(exc, LockError):
        return "lock_unavailable"
    if isinstance(exc, RedisError):
        return "redis"
    if isinstance(exc, Unavailable):
        if str(exc) == "fenced out":
            return "fenced_out"
        return "redis" if str(exc).startswith("redis") else "postgres"
    return "error"


def _now_ms() -> int:
    return int(time.time() * 1000)
