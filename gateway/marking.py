"""Building a sold-out sku's in-process mark, in the background.

A purchase that Redis answered settled sold out starts the build and is
answered at once; the requests after it are answered in-process once the mark
is set (``gateway.soldout``); while Redis rebuilds the sku's hashes the mark is
set at once, and its filter follows. The mark carries the sku's confirmed request ids,
read from Redis's done hash, or from the order rows while that hash is being
rebuilt (``gateway.rebuilds``), and read again only when their count changed.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from typing import Protocol

import structlog

from gateway.inventory import Inventory
from gateway.orders import Orders
from gateway.soldout import ConfirmedIds, SoldOut

log = structlog.get_logger(__name__)


class MarkObserver(Protocol):
    """What the metrics want to know of the marks (see gateway.metrics)."""

    def confirmed_ids_built(self, count: int, seconds: float) -> None: ...


class SoldOutMarking:
    """Builds sold-out marks, one build per sku at a time."""

    def __init__(
        self,
        soldout: SoldOut,
        inventory: Inventory,
        orders: Orders,
        observer: MarkObserver | None = None,
    ) -> None:
        self._soldout = soldout
        self._inventory = inventory
        self._orders = orders
        self._observer = observer
        self._building: dict[str, asyncio.Task[None]] = {}

    def start(self, sku: str, generation: tuple[int, int], *, rebuilding: bool = False) -> None:
        """Start building the sku's sold-out mark unless a build runs already.
        ``rebuilding``: Redis is rebuilding the sku's hashes, whose filter takes
        longer to build (from the order rows), so mark the sku at once without
        it (:meth:`SoldOut.mark_unbuilt`)."""
        if rebuilding:
            self._soldout.mark_unbuilt(sku, generation)
        if sku in self._building:
            return
        # A fresh context: the build must not log with the first request's bindings.
        task = asyncio.get_running_loop().create_task(
            self._mark(sku, generation), context=contextvars.Context()
        )
        self._building[sku] = task
        task.add_done_callback(functools.partial(self._built, sku))

    def _built(self, sku: str, task: asyncio.Task[None]) -> None:
        self._building.pop(sku, None)
        if not task.cancelled() and task.exception() is not None:
            # Nothing is lost: the next sold-out answer from Redis tries again.
            log.warning("sold_out_mark_failed", sku=sku, cause=repr(task.exception()))

    async def _mark(self, sku: str, generation: tuple[int, int]) -> None:
        rebuilding = await self._inventory.rebuilding(sku)
        if rebuilding:
            count = await self._orders.order_count(sku)
        else:
            count = await self._inventory.confirmed_count(sku)
        confirmed = self._soldout.built(sku, count)
        if confirmed is None:
            started = time.perf_counter()
            confirmed = ConfirmedIds(count)
            chunks = (
                self._orders.request_ids(sku) if rebuilding else self._inventory.confirmed_ids(sku)
            )
            async for chunk in chunks:
                confirmed.update(chunk)
            if self._observer is not None:
                self._observer.confirmed_ids_built(count, time.perf_counter() - started)
        self._soldout.mark(sku, generation, confirmed)
