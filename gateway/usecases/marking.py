"""Building a sold-out sku's in-process mark, in the background.

A purchase that Redis answered exhausted starts the build and is
answered at once; the requests after it are answered in-process once the mark
is set (``gateway.usecases.sold_out``). The mark carries the sku's confirmed request ids,
read from Redis's done hash, and read again only when their count changed.

While Redis rebuilds the sku's hashes after losing them (``gateway.usecases.rebuilds``)
the done hash is incomplete: the sku is marked at once without its filter
(``SoldOut.mark_unbuilt``), each request id then looked up in PostgreSQL
(``gateway.postgres.lookups``), and the filter is built from the done hash at a mark
after the rebuild. Reading a million ids from the order rows instead would
take the core PostgreSQL shares with the storm for seconds; the look-ups cost
the storm a small part of its rate (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from typing import Protocol

import structlog

from gateway.usecases.ports import ConfirmedIdsScan, RebuildLeases
from gateway.usecases.sold_out import ConfirmedIds, SoldOut

log = structlog.get_logger(__name__)


class MarkObserver(Protocol):
    """What the metrics want to know of the marks (see gateway.ops.metrics)."""

    def confirmed_ids_built(self, count: int, seconds: float) -> None: ...


class _Unobserved:
    """Marks nobody counts."""

    def confirmed_ids_built(self, count: int, seconds: float) -> None:
        """Nothing to count."""


UNOBSERVED = _Unobserved()


class SoldOutMarking:
    """Builds sold-out marks, one build per sku at a time."""

    def __init__(
        self,
        soldout: SoldOut,
        lease: RebuildLeases,
        scan: ConfirmedIdsScan,
        observer: MarkObserver = UNOBSERVED,
    ) -> None:
        self._soldout = soldout
        self._lease = lease
        self._scan = scan
        self._observer = observer
        self._building: dict[str, asyncio.Task[None]] = {}

    def start(self, sku: str, generation: tuple[int, int], *, rebuilding: bool = False) -> None:
        """Start building the sku's sold-out mark unless a build runs already.
        ``rebuilding``: Redis is rebuilding the sku's hashes, so mark it at once
        without its filter instead (:meth:`SoldOut.mark_unbuilt`)."""
        if rebuilding:
            self._soldout.mark_unbuilt(sku, generation)
            return
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
        if await self._lease.rebuilding(sku):
            # Told sold out after PostgreSQL cleared the purchase: the done hash
            # is incomplete, and the next request marks the sku without a filter.
            return
        count = await self._scan.count(sku)
        confirmed = self._soldout.built(sku, count)
        if confirmed is None:
            started = time.perf_counter()
            confirmed = ConfirmedIds(count)
            async for chunk in self._scan.ids(sku):
                confirmed.update(chunk)
            self._observer.confirmed_ids_built(count, time.perf_counter() - started)
        self._soldout.mark(sku, generation, confirmed)
