"""The in-process sold-out marks: set only while nothing changed, cleared by news."""

from __future__ import annotations

import asyncio

from gateway.usecases.sold_out import UNBUILT, ConfirmedIds, SoldOut


def ids(*request_ids: str) -> ConfirmedIds:
    """A filter over exactly these confirmed request ids."""
    return ConfirmedIds(len(request_ids), request_ids)


async def test_mark_and_lookup_keeps_confirmed_ids() -> None:
    """A marked sku answers sold out with the set of its confirmed request ids."""
    marks = SoldOut()
    marks.mark("s", marks.generation("s"), ids("r1"))
    confirmed = marks.lookup("s")
    assert confirmed is not None and "r1" in confirmed
    assert marks.lookup("other") is None


async def test_a_mark_without_its_filter_holds_every_id_until_replaced() -> None:
    """While Redis rebuilds the sale a sku is marked without a filter: every
    request id may be a replay (looked up); it never hides a mark with a filter,
    a change since the ask refuses it, and the built mark replaces it."""
    marks = SoldOut()
    generation = marks.generation("s")
    assert marks.mark_unbuilt("s", generation) is True
    unbuilt = marks.lookup("s")
    assert unbuilt is UNBUILT and "any-id" in unbuilt
    assert marks.mark("s", generation, ids("r1")) is True
    assert marks.mark_unbuilt("s", generation) is False
    confirmed = marks.lookup("s")
    assert confirmed is not UNBUILT and confirmed is not None and "r1" in confirmed
    marks.clear("s")
    assert marks.mark_unbuilt("s", generation) is False
    assert marks.lookup("s") is None


def test_the_filter_never_forgets_a_confirmed_id_and_rarely_invents_one() -> None:
    """Every one of 50,000 confirmed ids is in the filter (a replay is never told
    sold out); of 50,000 others about 0.1 % are, each then costing a look-up."""
    confirmed = ConfirmedIds(50_000, (f"r{i}" for i in range(50_000)))
    assert all(f"r{i}" in confirmed for i in range(50_000))
    false_positives = sum(f"other{i}" in confirmed for i in range(50_000))
    assert false_positives < 50_000 * 0.005
    # Compact: about 15 bits an id, not a dict of orders.
    assert confirmed.size_in_bytes < 50_000 * 2


def test_a_filter_is_reused_only_over_the_same_count() -> None:
    """Re-marking after expiry reuses the last filter while no order was added."""
    marks = SoldOut()
    built = ids("r1", "r2")
    marks.clear("s")  # even a mark refused by a change leaves its filter
    assert marks.mark("s", (0, 0), built) is False
    assert marks.built("s", 2) is built
    assert marks.built("s", 3) is None
    assert marks.built("other", 2) is None


async def test_an_announcement_between_ask_and_mark_wins() -> None:
    """If the sku changed after Redis was asked, the mark is not set."""
    marks = SoldOut()
    generation = marks.generation("s")
    marks.clear("s")
    assert marks.mark("s", generation, ids()) is False
    assert marks.lookup("s") is None


async def test_resubscription_invalidates_every_mark_in_flight() -> None:
    """clear_all drops marks and refuses marks taken before it, for any sku."""
    marks = SoldOut()
    marks.mark("a", marks.generation("a"), ids())
    generation = marks.generation("b")
    marks.clear_all()
    assert marks.lookup("a") is None
    assert marks.mark("b", generation, ids()) is False


async def test_marks_expire() -> None:
    """A mark lapses after its ttl, bounding a missed announcement's harm."""
    marks = SoldOut(ttl_s=0.01)
    marks.mark("s", marks.generation("s"), ids())
    deadline = asyncio.get_running_loop().time() + 2
    while marks.lookup("s") is not None:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.005)
