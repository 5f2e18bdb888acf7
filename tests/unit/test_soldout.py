"""The in-process sold-out marks: set only while nothing changed, cleared by news."""

from __future__ import annotations

import asyncio

from gateway.domain import Order
from gateway.soldout import SoldOut

ORDER = Order("o1", "r1", "s", "u", 1)


async def test_mark_and_lookup_keeps_confirmed_orders() -> None:
    """A marked sku answers sold out with its confirmed orders by request id."""
    marks = SoldOut()
    marks.mark("s", marks.generation("s"), {"r1": ORDER})
    confirmed = marks.lookup("s")
    assert confirmed is not None and confirmed["r1"] == ORDER
    assert marks.lookup("other") is None


async def test_an_announcement_between_ask_and_mark_wins() -> None:
    """If the sku changed after Redis was asked, the mark is not set."""
    marks = SoldOut()
    generation = marks.generation("s")
    marks.clear("s")
    assert marks.mark("s", generation, {}) is False
    assert marks.lookup("s") is None


async def test_resubscription_invalidates_every_mark_in_flight() -> None:
    """clear_all drops marks and refuses marks taken before it, for any sku."""
    marks = SoldOut()
    marks.mark("a", marks.generation("a"), {})
    generation = marks.generation("b")
    marks.clear_all()
    assert marks.lookup("a") is None
    assert marks.mark("b", generation, {}) is False


async def test_marks_expire() -> None:
    """A mark lapses after its ttl, bounding a missed announcement's harm."""
    marks = SoldOut(ttl_s=0.01)
    marks.mark("s", marks.generation("s"), {})
    deadline = asyncio.get_running_loop().time() + 2
    while marks.lookup("s") is not None:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.005)
