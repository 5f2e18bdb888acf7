"""The purchase use case: sold-out check, reservation, then the batch.

A request walks: the catalog (the sku exists, the quantity is allowed), the
in-process sold-out mark, ``reserve.lua`` in Redis (``Inventory.reserve``), then
the batcher, whose flusher commits it in PostgreSQL. A stock key Redis lost is
reloaded from PostgreSQL once for all the requests that find it missing.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import structlog

from gateway.batcher import Batcher
from gateway.catalog import Catalog
from gateway.domain import DUPLICATE, IN_PROGRESS, SOLD_OUT, Outcome, Purchase, Result, SkuInfo
from gateway.errors import (
    Ended,
    IdempotencyMismatch,
    InvalidRequest,
    NotStarted,
    RateLimited,
    ShuttingDown,
    Unavailable,
)
from gateway.flusher import Flusher
from gateway.inventory import Inventory, Reply
from gateway.orders import Orders
from gateway.rules import SaleRules
from gateway.soldout import ConfirmedIds, SoldOut

log = structlog.get_logger(__name__)

_ANSWERS = {"sold_out": SOLD_OUT, "duplicate": DUPLICATE, "in_progress": IN_PROGRESS}


class PurchaseObserver(Protocol):
    """What the metrics want to know of the purchases (see gateway.metrics)."""

    def stock_reloaded(self) -> None: ...
    def shed_one(self) -> None: ...
    def confirmed_ids_built(self, count: int, seconds: float) -> None: ...


class Purchases:
    """Decides purchases; the batcher and its flusher commit the survivors."""

    def __init__(
        self,
        *,
        catalog: Catalog,
        soldout: SoldOut,
        inventory: Inventory,
        orders: Orders,
        batcher: Batcher,
        flusher: Flusher,
        observer: PurchaseObserver | None = None,
    ) -> None:
        self._catalog = catalog
        self._soldout = soldout
        self._inventory = inventory
        self._orders = orders
        self._batcher = batcher
        self._flusher = flusher
        self._observer = observer
        self._reloads: dict[str, asyncio.Future[None]] = {}
        # A sku's sold-out mark being built, in the background: the requests
        # that saw it sold out are answered at once, not after the build.
        self._marking: dict[str, asyncio.Task[None]] = {}

    async def purchase(
        self, purchase: Purchase, client: Callable[[], str | None] | None = None
    ) -> Result:
        """Decide one purchase; ``client`` names the client's address (asked only
        when a client rate limit applies). Raises a :class:`GatewayError` for
        4xx/503 answers (not_started, ended and rate_limited included)."""
        info = await self._catalog.get(purchase.sku)
        if purchase.qty > info.per_user_limit:
            raise InvalidRequest(f"qty exceeds the per-user limit of {info.per_user_limit}")
        confirmed = self._soldout.lookup(purchase.sku)
        if confirmed is not None:
            # Without a request id, or with one that has no order: no I/O.
            if not purchase.request_id or purchase.request_id not in confirmed:
                return SOLD_OUT
            return await self._replay(purchase)
        purchase = purchase.identified()
        structlog.contextvars.bind_contextvars(request_id=purchase.request_id, sku=purchase.sku)
        self._admit()
        generation = self._soldout.generation(purchase.sku)
        reply = await self._inventory.reserve(purchase, info, client)
        if reply.kind == "missing":
            await self._reload_once(purchase.sku)
            reply = await self._inventory.reserve(purchase, info, client)
        if reply.kind == "ok":
            # Stamped by Redis's clock, like every reservation of every instance.
            purchase = replace(purchase, reserved_at_ms=reply.reserved_at_ms)
            try:
                return await self._batcher.submit(purchase)
            except ShuttingDown:
                # Draining began while Redis reserved: nothing will flush it here.
                await self._flusher.give_back(purchase.sku, [purchase])
                raise
        if reply.kind == "sold_out" and reply.settled:
            self._mark_in_background(purchase.sku, generation)
        return _answer(reply, purchase.request_id, info)

    async def available(self, sku: str) -> int:
        """Units left to reserve: Redis's count, else the database's; raises UnknownSku."""
        await self._catalog.get(sku)
        available = await self._inventory.available(sku)
        if available is None:
            available = await self._orders.stock(sku) or 0
        return available

    async def rules(self, sku: str) -> SaleRules:
        """The sku's window and own rates; raises UnknownSku."""
        return (await self._catalog.get(sku)).rules

    def _admit(self) -> None:
        """Refuse a purchase before reserving when draining or the queue is full."""
        if self._batcher.closing:
            raise ShuttingDown()
        if self._batcher.full:
            if self._observer is not None:
                self._observer.shed_one()
            raise Unavailable("gateway busy")

    async def _reload_once(self, sku: str) -> None:
        """Reload a sku's missing Redis state, once for all the requests that find it
        missing: a storm of them must cost one load, not one per request."""
        future = self._reloads.get(sku)
        if future is None:
            future = self._reloads[sku] = asyncio.ensure_future(self._reload(sku))
            future.add_done_callback(lambda _: self._reloads.pop(sku, None))
        await asyncio.shield(future)

    async def _replay(self, purchase: Purchase) -> Result:
        """A sold-out sku's answer to a request id its filter may hold: Redis's
        done hash, else the order rows (Redis lost or dropped the sale's state,
        or the filter erred, about once in a thousand)."""
        rid = purchase.request_id
        order = await self._inventory.confirmed_order(purchase.sku, rid)
        if order is None:
            order = await self._orders.order(rid)
        if order is None:
            return SOLD_OUT
        if order.sku != purchase.sku:
            raise IdempotencyMismatch(rid)
        if (order.user_id, order.qty) != (purchase.user_id, purchase.qty):
            raise IdempotencyMismatch(purchase.request_id)
        return Result(Outcome.CONFIRMED, order)

    def _mark_in_background(self, sku: str, generation: tuple[int, int]) -> None:
        """Start building the sku's sold-out mark unless a build runs already."""
        if sku in self._marking:
            return
        # A fresh context: the build must not log with the first request's bindings.
        task = asyncio.get_running_loop().create_task(
            self._mark_sold_out(sku, generation), context=contextvars.Context()
        )
        self._marking[sku] = task
        task.add_done_callback(functools.partial(self._marked, sku))

    def _marked(self, sku: str, task: asyncio.Task[None]) -> None:
        self._marking.pop(sku, None)
        if not task.cancelled() and task.exception() is not None:
            # Nothing is lost: the next sold-out answer from Redis tries again.
            log.warning("sold_out_mark_failed", sku=sku, cause=repr(task.exception()))

    async def _mark_sold_out(self, sku: str, generation: tuple[int, int]) -> None:
        # The confirmed ids come along, so replays are told apart in-process;
        # they are read again only when more orders were confirmed since.
        count = await self._inventory.confirmed_count(sku)
        confirmed = self._soldout.built(sku, count)
        if confirmed is None:
            started = time.perf_counter()
            confirmed = ConfirmedIds(count)
            async for chunk in self._inventory.confirmed_ids(sku):
                confirmed.update(chunk)
            if self._observer is not None:
                self._observer.confirmed_ids_built(count, time.perf_counter() - started)
        self._soldout.mark(sku, generation, confirmed)

    async def _reload(self, sku: str) -> None:
        # Redis may have lost everything of the sku, not just the counter: put
        # the committed orders back first, so replays and repeat buyers are
        # answered from them once the counter reappears.
        await self._inventory.restore_orders(sku, await self._orders.sku_orders(sku))
        stock = await self._orders.stock(sku)
        if stock is None:
            raise Unavailable("sku vanished")
        await self._inventory.load_stock(sku, stock, reset=False)
        if self._observer is not None:
            self._observer.stock_reloaded()
        log.warning("stock_reloaded", sku=sku, stock=stock)


def _answer(reply: Reply, request_id: str, info: SkuInfo) -> Result:
    """The outcome of a reservation that did not reserve."""
    if reply.kind == "confirmed":
        return Result(Outcome.CONFIRMED, reply.order)
    if reply.kind == "mismatch":
        raise IdempotencyMismatch(request_id)
    if reply.kind == "rate_limited":
        raise RateLimited(reply.wait_ms)
    if reply.kind == "not_started":
        starts_at = info.rules.window_json()["starts_at"]
        raise NotStarted(starts_at or "", reply.wait_ms)
    if reply.kind == "ended":
        raise Ended()
    result = _ANSWERS.get(reply.kind)
    if result is None:
        raise Unavailable("stock not loaded")
    return result
