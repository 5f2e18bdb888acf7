"""Rebuilding a sku's Redis hashes after Redis lost its sale, in the background.

When a sku's stock counter is found missing, ``load_stock.lua`` sets it from
PostgreSQL's stock and flags the sku as rebuilding in the same step. From then
on ``reserve.lua`` trusts neither its buyers nor its done hash for a purchase it
finds in neither: it answers "unverified", the purchase is checked against
PostgreSQL's unique request id and (sku, user) (``PriorLookups``: one read for
the sku's purchases waiting) and only then reserved; for a second after that
answer the gateway checks the sku's purchases first and sends them verified,
one reserve.lua call each (``gateway.usecases.purchases``). No purchase waits
for the rebuild.

The rebuild itself (every order row of the sku written back into the two
hashes) runs once across the fleet: the first instance to take the sku's
rebuild lease (``lua/rebuild.lua``) does it; the others go on through
PostgreSQL's checks until the flag is gone. A holder that dies or stalls lets
its lease run out, and the next instance whose purchase finds it so
("unverified", orphaned) takes it over. Pages are read in the (sku, user_id)
index's order, written one script call each, and paced by the loop's CPU:
after a page during which the loop's thread spent c seconds of CPU (the page's
own work and, under load, the buyers' it ran meanwhile), the task sleeps
c * (1 / share - 1), at most :data:`MAX_PAUSE_S`, so the rebuild's pages take
at most ``share`` of the loop's CPU time (``GATEWAY_REBUILD_SHARE``): with the
loop idle a page costs a few milliseconds and the rebuild runs at the pace of
PostgreSQL and Redis; under a storm it yields to the buyers.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from gateway.usecases.ports import OrderPages, RebuildLeases

log = structlog.get_logger(__name__)

# Orders per page: one PostgreSQL read and one script call, whose work on the
# loop (a few ms of CPU, most of it the two round trips' fixed cost, not the
# rows; docs/performance.md) bounds what a page adds to the loop's lag.
PAGE = 1000
# How long a holder may go without writing a page before another takes over.
LEASE_MS = 10_000
# The longest pause after a page: a quarter of the lease, so the pacing alone
# never lets the lease run out between two writes (the pause, one read and one
# script call must fit in it; only a read or call stalled for 7.5 s loses it,
# which is what the lease is for). Uncapped, a page during which a saturated
# loop spent over 1.1 s of CPU would pause past the lease, and another
# instance would take the rebuild over from the first page. A page that asks
# for more than this ran on such a loop, its CPU almost all the buyers': the
# page's own few milliseconds stay far below the share after this pause.
MAX_PAUSE_S = LEASE_MS / 1000 / 4


class RebuildObserver(Protocol):
    """What the metrics want to know of the rebuilds (see gateway.ops.metrics)."""

    def rebuilt(self, orders: int, seconds: float) -> None: ...


class _Unobserved:
    """Rebuilds nobody counts."""

    def rebuilt(self, orders: int, seconds: float) -> None:
        """Nothing to count."""


UNOBSERVED = _Unobserved()


class Rebuilds:
    """Starts and runs this instance's rebuilds, one task per sku at most.

    ``cpu_clock`` (the loop thread's CPU time) and ``sleep`` pace the pages;
    a test passes its own to play a saturated loop."""

    def __init__(
        self,
        lease: RebuildLeases,
        orders: OrderPages,
        observer: RebuildObserver = UNOBSERVED,
        *,
        share: float,
        page: int = PAGE,
        cpu_clock: Callable[[], float] = time.thread_time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._lease = lease
        self._orders = orders
        self._observer = observer
        self._share = share
        self._page = page
        self._cpu_clock = cpu_clock
        self._sleep = sleep
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
        owner = uuid.uuid4().hex
        if not await self._lease.take(sku, owner, LEASE_MS):
            return
        started, written, after = time.perf_counter(), 0, ""
        while True:
            cpu = self._cpu_clock()
            page = await self._orders.order_page(sku, after, self._page)
            if page.count and not await self._lease.write(sku, owner, LEASE_MS, page.fields):
                log.warning("rebuild_lease_lost", sku=sku, written=written)
                return
            written += page.count
            if page.count < self._page:
                break
            after = page.last_user
            spent = self._cpu_clock() - cpu
            await self._sleep(min(spent * (1 / self._share - 1), MAX_PAUSE_S))
        if await self._lease.finish(sku, owner):
            seconds = time.perf_counter() - started
            self._observer.rebuilt(written, seconds)
            log.warning("sale_rebuilt", sku=sku, orders=written, seconds=round(seconds, 3))
