"""Rebuilding a sku's Redis hashes after Redis lost its sale, in the background.

When a sku's stock counter is found missing, ``load_stock.lua`` sets it from
PostgreSQL's stock and flags the sku as rebuilding in the same step. From then
on ``reserve.lua`` trusts neither its buyers nor its done hash for a purchase it
finds in neither: it answers "unverified", the purchase is checked against
PostgreSQL's unique request id and (sku, user) (``Orders.prior``) and only then
reserved. No purchase waits for the rebuild.

The rebuild itself (every order row of the sku written back into the two
hashes) runs once across the fleet: the first instance to take the sku's
rebuild lease (``lua/rebuild.lua``) does it; the others go on through
PostgreSQL's checks until the flag is gone. A holder that dies or stalls lets
its lease run out, and the next instance whose purchase finds it so
("unverified", orphaned) takes it over. Pages are read in the (sku, user_id)
index's order, written one script call each, and paced: after each page the
task sleeps so that it takes at most :data:`SHARE` of the loop's time, however
big the sale.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import uuid
from typing import Protocol

import structlog

from gateway.inventory import Inventory
from gateway.orders import Orders

log = structlog.get_logger(__name__)

# Orders per page: one PostgreSQL read and one script call (rebuild.lua's
# unpack bound is 8000 values; a page is 2 x PAGE).
PAGE = 2000
# The most of the loop's time a rebuild takes: after a page that took t, it
# sleeps t * (1 / SHARE - 1).
SHARE = 0.1
# How long a holder may go without writing a page before another takes over.
LEASE_MS = 10_000


class RebuildObserver(Protocol):
    """What the metrics want to know of the rebuilds (see gateway.metrics)."""

    def rebuilt(self, orders: int, seconds: float) -> None: ...


class Rebuilds:
    """Starts and runs this instance's rebuilds, one task per sku at most."""

    def __init__(
        self,
        inventory: Inventory,
        orders: Orders,
        observer: RebuildObserver | None = None,
        *,
        share: float = SHARE,
        page: int = PAGE,
    ) -> None:
        self._inventory = inventory
        self._orders = orders
        self._observer = observer
        self._share = share
        self._page = page
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def running(self, sku: str) -> bool:
        """Whether this instance is rebuilding ``sku`` now."""
        return sku in self._tasks

    def ensure(self, sku: str) -> None:
        """Try, in the background, to take the sku's rebuild lease and rebuild;
        nothing when this instance rebuilds it already or another holds it."""
        if sku in self._tasks:
            return
        # A fresh context: the rebuild must not log with a request's bindings.
        task = asyncio.get_running_loop().create_task(self._run(sku), context=contextvars.Context())
        self._tasks[sku] = task
        task.add_done_callback(lambda done: self._ended(sku, done))

    async def close(self) -> None:
        """Stop every rebuild of this instance; its lease runs out for another."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _ended(self, sku: str, task: asyncio.Task[None]) -> None:
        self._tasks.pop(sku, None)
        if not task.cancelled() and task.exception() is not None:
            # Nothing is lost: the lease runs out and a later purchase takes it.
            log.warning("rebuild_failed", sku=sku, cause=repr(task.exception()))

    async def _run(self, sku: str) -> None:
        token = uuid.uuid4().hex
        if not await self._inventory.take_rebuild(sku, token, LEASE_MS):
            return
        started, written, after = time.perf_counter(), 0, ""
        while True:
            began = time.perf_counter()
            rows = await self._orders.order_page(sku, after, self._page)
            if rows and not await self._inventory.write_rebuilt(sku, token, LEASE_MS, rows):
                log.warning("rebuild_lease_lost", sku=sku, written=written)
                return
            written += len(rows)
            if len(rows) < self._page:
                break
            after = rows[-1][2]
            await asyncio.sleep((time.perf_counter() - began) * (1 / self._share - 1))
        if await self._inventory.finish_rebuild(sku, token):
            seconds = time.perf_counter() - started
            if self._observer is not None:
                self._observer.rebuilt(written, seconds)
            log.warning("sale_rebuilt", sku=sku, orders=written, seconds=round(seconds, 3))
