"""Orders looked up by request id in PostgreSQL, coalesced.

While Redis rebuilds a lost sale's hashes, a sold-out sku's in-process mark has
no filter of confirmed ids yet (``gateway.soldout``), so every request id of a
storm may be a replay and is looked up in PostgreSQL's unique ``request_id``.
One read per request would queue the storm on the pool; here the ids asked for
while a read runs wait for the next one, which takes them all at once (one
``request_id = ANY($1)``, at most :data:`MAX_IDS`): one read in flight at a
time, and the busier the storm the more ids a read carries.
"""

from __future__ import annotations

import asyncio

from gateway.domain import Order
from gateway.orders import Orders

# Request ids per read at most; the rest wait for the next.
MAX_IDS = 1000


class OrderLookups:
    """The orders of request ids, read one coalesced query at a time."""

    def __init__(self, orders: Orders, max_ids: int = MAX_IDS) -> None:
        self._orders = orders
        self._max_ids = max_ids
        self._waiting: dict[str, list[asyncio.Future[Order | None]]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def order(self, request_id: str) -> Order | None:
        """The order ``request_id`` made, if any; raises PostgresUnavailable."""
        future: asyncio.Future[Order | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(request_id, []).append(future)
        if self._reader is None:
            self._reader = asyncio.ensure_future(self._read())
        return await future

    async def _read(self) -> None:
        """Read for the waiting ids until none wait; each read's failure goes to
        its own callers."""
        try:
            while self._waiting:
                ids = list(self._waiting)[: self._max_ids]
                batch = {rid: self._waiting.pop(rid) for rid in ids}
                try:
                    found = await self._orders.orders(ids)
                except Exception as exc:  # PostgresUnavailable: each caller answers 503
                    for futures in batch.values():
                        _settle(futures, exc=exc)
                    continue
                for rid, futures in batch.items():
                    _settle(futures, found.get(rid))
        finally:
            self._reader = None


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
