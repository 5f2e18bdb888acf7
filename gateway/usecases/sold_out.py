"""In-process knowledge of sold-out skus: the fastest answer the gateway gives.

A sku is marked only when Redis reported it exhausted (no stock and nothing
pending), so no order of it can still be confirmed. The mark carries a compact
set of that sku's confirmed request ids, a Bloom filter: a request id it does
not hold has no order and is answered sold out with no I/O (as is a purchase
without a request id, which can never be a replay); one it holds is looked up
in Redis, since the filter errs on that side about once in a thousand.

A change announced on pub/sub (restock, reset, stock given back) clears the
mark on every instance. Marks also expire, which bounds how long a missed
announcement can mislead. A sku's filter outlives its mark: the confirmed
orders of a sku only ever grow, so while their count is unchanged the filter
built for the last mark still holds every one of them, and re-marking costs one
count, not a pass over every order.

While Redis rebuilds a lost sale's hashes (``gateway.usecases.rebuilds``), a sku it
reports exhausted is marked at once without its filter, which is built from the
order rows meanwhile (``gateway.usecases.marking``): every request id may be a replay
then and is looked up in PostgreSQL, a purchase without one is sold out at once.

A generation counter per sku closes the race between a reservation that saw
"sold out" and an announcement that arrived before the mark was set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from rbloom import Bloom

MARK_TTL_S = 5.0
# One id in a thousand not confirmed costs a Redis and a PostgreSQL look-up.
FALSE_POSITIVE_RATE = 0.001
MIN_CAPACITY = 1024


class ConfirmedIds:
    """The confirmed request ids of a sku, as counted when the set was built."""

    __slots__ = ("_bloom", "count")

    def __init__(self, count: int, request_ids: Iterable[str] = ()) -> None:
        self.count = count
        self._bloom = Bloom(max(count, MIN_CAPACITY), FALSE_POSITIVE_RATE)
        self._bloom.update(request_ids)

    def update(self, request_ids: Iterable[str]) -> None:
        """Add request ids (a chunk of a scan)."""
        self._bloom.update(request_ids)

    def __contains__(self, request_id: object) -> bool:
        """False: no order has this request id. True: it probably has one."""
        return request_id in self._bloom

    @property
    def size_in_bytes(self) -> int:
        """Memory the filter's bits take."""
        return int(self._bloom.size_in_bits) // 8


class UnknownIds:
    """The confirmed ids of a sold-out sku whose filter is not built yet: any
    request id may have an order."""

    __slots__ = ()

    def __contains__(self, request_id: object) -> bool:
        """Always True: look the request id up."""
        return True


UNBUILT = UnknownIds()


class SoldOut:
    """Which skus are sold out here, with their confirmed request ids."""

    def __init__(self, ttl_s: float = MARK_TTL_S) -> None:
        self._ttl = ttl_s
        self._marks: dict[str, tuple[float, ConfirmedIds | UnknownIds]] = {}
        self._built: dict[str, ConfirmedIds] = {}
        self._generations: dict[str, int] = {}
        self._epoch = 0

    def generation(self, sku: str) -> tuple[int, int]:
        """Take before asking Redis; pass to :meth:`mark` afterwards."""
        return (self._epoch, self._generations.get(sku, 0))

    def lookup(self, sku: str) -> ConfirmedIds | UnknownIds | None:
        """The confirmed ids of a sold-out sku (:data:`UNBUILT` while its filter
        is built), or None when not known sold out."""
        mark = self._marks.get(sku)
        if mark is None:
            return None
        if mark[0] <= asyncio.get_running_loop().time():
            del self._marks[sku]
            return None
        return mark[1]

    def built(self, sku: str, count: int) -> ConfirmedIds | None:
        """The sku's last filter if it was built over ``count`` confirmed orders."""
        ids = self._built.get(sku)
        return ids if ids is not None and ids.count == count else None

    def mark(self, sku: str, generation: tuple[int, int], confirmed: ConfirmedIds) -> bool:
        """Mark a sku sold out unless it changed since ``generation``; returns whether marked."""
        self._built[sku] = confirmed
        if self.generation(sku) != generation:
            return False
        self._marks[sku] = (asyncio.get_running_loop().time() + self._ttl, confirmed)
        return True

    def mark_unbuilt(self, sku: str, generation: tuple[int, int]) -> bool:
        """Mark a sku sold out before its filter is built (:data:`UNBUILT`), unless
        it changed since ``generation`` or is marked already; returns whether marked."""
        if self.generation(sku) != generation or self.lookup(sku) is not None:
            return False
        self._marks[sku] = (asyncio.get_running_loop().time() + self._ttl, UNBUILT)
        return True

    def clear(self, sku: str) -> None:
        """The sku changed: forget the mark and invalidate marks being taken."""
        self._generations[sku] = self._generations.get(sku, 0) + 1
        self._marks.pop(sku, None)

    # What the change feed tells (gateway.redis.change_feed.ChangeSubscriber).
    def stock_returned(self, sku: str) -> None:
        """Stock came back: the sku's mark is stale."""
        self.clear(sku)

    def sku_changed(self, sku: str) -> None:
        """An admin changed the sku: its mark is stale."""
        self.clear(sku)

    def state_dropped(self) -> None:
        """Redis dropped every sku's state: marks and the filters built from it go."""
        self.clear_all(filters=True)

    def feed_resumed(self) -> None:
        """Announcements may have been missed: every mark goes (filters still hold)."""
        self.clear_all()

    def clear_all(self, *, filters: bool = False) -> None:
        """Forget every mark (the change feed was interrupted), and with ``filters``
        every filter too (the state they were built from was dropped)."""
        self._epoch += 1
        self._marks.clear()
        if filters:
            self._built.clear()
