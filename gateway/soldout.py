"""In-process knowledge of sold-out skus: the fastest answer the gateway gives.

A sku is marked only when Redis reported it settled (no stock and nothing
pending), so no order of it can still be confirmed; with the mark the gateway
keeps that sku's confirmed request ids, so a replay of a confirmed purchase
still gets its order without any I/O. A change announced on pub/sub (restock,
reset, stock given back) clears the mark on every instance. Marks also expire,
which bounds how long a missed announcement can mislead.

A generation counter per sku closes the race between a reservation that saw
"sold out" and an announcement that arrived before the mark was set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from gateway.domain import Order

MARK_TTL_S = 5.0


class SoldOut:
    """Which skus are sold out here, with their confirmed orders by request id."""

    def __init__(self, ttl_s: float = MARK_TTL_S) -> None:
        self._ttl = ttl_s
        self._marks: dict[str, tuple[float, Mapping[str, Order]]] = {}
        self._generations: dict[str, int] = {}
        self._epoch = 0

    def generation(self, sku: str) -> tuple[int, int]:
        """Take before asking Redis; pass to :meth:`mark` afterwards."""
        return (self._epoch, self._generations.get(sku, 0))

    def lookup(self, sku: str) -> Mapping[str, Order] | None:
        """The confirmed orders of a sold-out sku, or None when not known sold out."""
        mark = self._marks.get(sku)
        if mark is None:
            return None
        if mark[0] <= asyncio.get_running_loop().time():
            del self._marks[sku]
            return None
        return mark[1]

    def mark(self, sku: str, generation: tuple[int, int], confirmed: Mapping[str, Order]) -> bool:
        """Mark a sku sold out unless it changed since ``generation``; returns whether marked."""
        if self.generation(sku) != generation:
            return False
        self._marks[sku] = (asyncio.get_running_loop().time() + self._ttl, confirmed)
        return True

    def clear(self, sku: str) -> None:
        """The sku changed: forget the mark and invalidate marks being taken."""
        self._generations[sku] = self._generations.get(sku, 0) + 1
        self._marks.pop(sku, None)

    def clear_all(self) -> None:
        """Forget every mark (the change feed was interrupted)."""
        self._epoch += 1
        self._marks.clear()
