"""Orders looked up in PostgreSQL while Redis rebuilds a sale, coalesced.

While Redis rebuilds a lost sale's hashes, neither its done hash nor its
buyers hash can be trusted, so PostgreSQL answers what they would:

- a sold-out sku's in-process mark has no filter of confirmed ids yet
  (``gateway.usecases.sold_out``), so every request id of a storm may be a
  replay and is looked up in PostgreSQL's unique ``request_id``
  (:class:`OrderLookups`);
- an in-stock sku's new purchase may be a replay or a repeat buyer, looked up
  in the unique ``request_id`` and ``(sku, user_id)`` (:class:`PriorLookups`)
  before ``reserve.lua`` may take it.

After this gateway saw Redis fail (``gateway.usecases.doubt``), a sold-out
answer to a request id is arbitrated instead (:class:`Arbitrations`): Redis
may have lost the ledger entry of a reservation whose flush is still on its
way, so a look-up that finds no order would not stay true. Under the sku's
inventory row lock, as the reconciler settles a stale reservation, the order
is read, or else the request id is recorded as released now, so that no
flush commits a reservation of it made before (``flush_batch()`` answers it
"X" and its buyer retries).

One read per request would queue a storm on the pool the flushes use; here
the keys asked for in one loop turn go out in one read (``= ANY($1)``, at most
:data:`MAX_IDS`, one sku per read for the priors), with at most
:data:`MAX_READS` reads in flight: keys asked for while that many run wait for
the next one free, which takes them all at once, so the busier the storm the
more keys a read carries and the pool keeps connections for the flushes.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from gateway.domain.model import Order
from gateway.domain.stock import Prior
from gateway.postgres.orders import Orders

# Keys per read at most; the rest wait for the next.
MAX_IDS = 1000
# Reads in flight at most, per kind (of the pool's GATEWAY_DB_POOL_SIZE, 8 by
# default).
MAX_READS = 3

K = TypeVar("K")
V = TypeVar("V")

# A purchase's (sku, request_id, user_id), and what PostgreSQL holds of it: the
# order its request id made, and whether its buyer bought the sku.
PriorKey = tuple[str, str, str]


class _Coalesced(ABC, Generic[K, V]):
    """Answers for keys, read one coalesced query at a time; a subclass says
    which waiting keys go in one read (:meth:`_batch`) and reads them
    (:meth:`_read_many`)."""

    def __init__(self, orders: Orders, max_ids: int, max_reads: int) -> None:
        self._orders = orders
        self._max_ids = max_ids
        self._max_reads = max_reads
        self._waiting: dict[K, list[asyncio.Future[V]]] = {}
        self._readers: set[asyncio.Task[None]] = set()
        self._scheduled = False

    async def _ask(self, key: K) -> V:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[V] = loop.create_future()
        self._waiting.setdefault(key, []).append(future)
        if not self._scheduled and len(self._readers) < self._max_reads:
            # At the end of this loop turn, with every key this turn asked for.
            self._scheduled = True
            loop.call_soon(self._start)
        return await future

    def _start(self) -> None:
        self._scheduled = False
        if self._waiting and len(self._readers) < self._max_reads:
            self._readers.add(asyncio.ensure_future(self._read()))

    async def _read(self) -> None:
        """Read for the waiting keys until none wait; a read's failure goes to
        its own callers. The reader leaves the reads in flight in the step that
        finds nothing waiting: left to its task's done callback, it still
        counted after a caller it answered had asked again, and that key, with
        every read slot seen taken, waited for a read that never came."""
        try:
            while self._waiting:
                batch = {key: self._waiting.pop(key) for key in self._batch()}
                try:
                    found = await self._read_many(list(batch))
                except Exception as exc:  # never leave a caller waiting: each answers 503
                    for futures in batch.values():
                        _fail(futures, exc)
                    continue
                for key, futures in batch.items():
                    _resolve(futures, found[key])
        finally:
            reader = asyncio.current_task()
            if reader is not None:
                self._readers.discard(reader)

    def _batch(self) -> list[K]:
        return list(self._waiting)[: self._max_ids]

    @abstractmethod
    async def _read_many(self, keys: list[K]) -> dict[K, V]:
        """The answer of every one of ``keys``, in one read."""


class OrderLookups(_Coalesced[str, Order | None]):
    """The orders of request ids (any sku's), one ``request_id = ANY`` read at a time."""

    def __init__(self, orders: Orders, max_ids: int = MAX_IDS, max_reads: int = MAX_READS) -> None:
        super().__init__(orders, max_ids, max_reads)

    async def order(self, request_id: str) -> Order | None:
        """The order ``request_id`` made, if any; raises PostgresUnavailable."""
        return await self._ask(request_id)

    async def _read_many(self, keys: list[str]) -> dict[str, Order | None]:
        found = await self._orders.orders(keys)
        return {rid: found.get(rid) for rid in keys}


class PriorLookups(_Coalesced[PriorKey, Prior]):
    """What PostgreSQL holds of new purchases while their sku is rebuilt, one
    read per sku for the purchases waiting (:meth:`Orders.priors`)."""

    def __init__(self, orders: Orders, max_ids: int = MAX_IDS, max_reads: int = MAX_READS) -> None:
        super().__init__(orders, max_ids, max_reads)

    async def prior(self, sku: str, request_id: str, user_id: str) -> Prior:
        """The order ``request_id`` made (of any sku), if any, and whether
        ``user_id`` bought ``sku``; raises PostgresUnavailable."""
        return await self._ask((sku, request_id, user_id))

    def _batch(self) -> list[PriorKey]:
        # One sku per read: its (sku, user_id) look-up is one index range.
        sku = next(iter(self._waiting))[0]
        return [key for key in self._waiting if key[0] == sku][: self._max_ids]

    async def _read_many(self, keys: list[PriorKey]) -> dict[PriorKey, Prior]:
        sku = keys[0][0]
        made, bought = await self._orders.priors(
            sku, [rid for _, rid, _ in keys], [user for _, _, user in keys]
        )
        return {key: (made.get(key[1]), key[2] in bought) for key in keys}


class Arbitrations(_Coalesced[tuple[str, str], Order | None]):
    """Sold-out answers to request ids made final in PostgreSQL, one
    transaction per sku for the request ids waiting (:meth:`Orders.release_stale`)."""

    def __init__(self, orders: Orders, max_ids: int = MAX_IDS, max_reads: int = MAX_READS) -> None:
        super().__init__(orders, max_ids, max_reads)

    async def order(self, sku: str, request_id: str) -> Order | None:
        """The order ``request_id`` made (of any sku), if any; else None, and no
        reservation of it made before now commits any more; raises
        PostgresUnavailable."""
        return await self._ask((sku, request_id))

    def _batch(self) -> list[tuple[str, str]]:
        # One sku per transaction: it holds that sku's inventory row lock.
        sku = next(iter(self._waiting))[0]
        return [key for key in self._waiting if key[0] == sku][: self._max_ids]

    async def _read_many(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], Order | None]:
        # Reservations are stamped by Redis's clock, this by the gateway's: a
        # skew between them shifts which reservations count as before.
        now_ms = int(time.time() * 1000)
        found = await self._orders.release_stale(keys[0][0], [(rid, now_ms) for _, rid in keys])
        return {key: found.get(key[1]) for key in keys}


def _resolve(futures: list[asyncio.Future[V]], value: V) -> None:
    for future in futures:
        if not future.done():  # else its caller gave up (cancelled)
            future.set_result(value)


def _fail(futures: list[asyncio.Future[V]], exc: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(exc)
