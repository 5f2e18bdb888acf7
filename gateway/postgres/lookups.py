"""Orders looked up by request id in PostgreSQL, coalesced.

While Redis rebuilds a lost sale's hashes, a sold-out sku's in-process mark has
no filter of confirmed ids yet (``gateway.usecases.sold_out``), so every request id of a
storm may be a replay and is looked up in PostgreSQL's unique ``request_id``.
One read per request would queue the storm on the pool; here the ids asked for
in one loop turn go out in one read (``request_id = ANY($1)``, at most
:data:`MAX_IDS`), with at most :data:`MAX_READS` reads in flight: ids asked for
while that many run wait for the next one free, which takes them all at once,
so the busier the storm the more ids a read carries and the pool keeps
connections for the flushes.
"""

from __future__ import annotations

import asyncio

from gateway.domain.model import Order
from gateway.postgres.orders import Orders

# Request ids per read at most; the rest wait for the next.
MAX_IDS = 1000
# Reads in flight at most (of the pool's GATEWAY_DB_POOL_SIZE, 8 by default).
MAX_READS = 3


class OrderLookups:
    """The orders of request ids, read one coalesced query at a time."""

    def __init__(self, orders: Orders, max_ids: int = MAX_IDS, max_reads: int = MAX_READS) -> None:
        self._orders = orders
        self._max_ids = max_ids
        self._max_reads = max_reads
        self._waiting: dict[str, list[asyncio.Future[Order | None]]] = {}
        self._readers: set[asyncio.Task[None]] = set()
        self._scheduled = False

    async def order(self, request_id: str) -> Order | None:
        """The order ``request_id`` made, if any; raises PostgresUnavailable."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Order | None] = loop.create_future()
        self._waiting.setdefault(request_id, []).append(future)
        if not self._scheduled and len(self._readers) < self._max_reads:
            # At the end of this loop turn, with every id this turn asked for.
            self._scheduled = True
            loop.call_soon(self._start)
        return await future

    def _start(self) -> None:
        self._scheduled = False
        if self._waiting and len(self._readers) < self._max_reads:
            reader = asyncio.ensure_future(self._read())
            self._readers.add(reader)
            reader.add_done_callback(self._readers.discard)

    async def _read(self) -> None:
        """Read for the waiting ids until none wait; a read's failure goes to its
        own callers."""
        while self._waiting:
            ids = list(self._waiting)[: self._max_ids]
            batch = {rid: self._waiting.pop(rid) for rid in ids}
            try:
                found = await self._orders.orders(ids)
            except Exception as exc:  # never leave a caller waiting: each answers 503
                for futures in batch.values():
                    _settle(futures, exc=exc)
                continue
            for rid, futures in batch.items():
                _settle(futures, found.get(rid))


def _settle(
    futures: list[asyncio.Future[Order | None]],
    order: Order | None = None,
    exc: BaseException | None = None,
) -> None:
    for future in futures:
        if future.done():  # its caller gave up (cancelled)
            continue
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(order)
