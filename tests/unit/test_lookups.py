"""The rebuild's prior-order checks, coalesced (``gateway.postgres.lookups``):
the purchases of one sku waiting go out in one read, one sku a read, a bounded
number of reads in flight, and a read's failure reaches each of its callers.
PostgreSQL is played by the test; tests/integration/test_rebuild.py runs the
query itself."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

import pytest

from gateway.domain.errors import PostgresUnavailable
from gateway.domain.model import Order
from gateway.postgres.lookups import PriorLookups
from gateway.postgres.orders import Orders
from testkit.polling import wait_for


class Rows:
    """The orders table as ``Orders.priors`` reads it; each read is recorded and
    held until the test opens ``gate``."""

    def __init__(self, orders: list[Order], fail: bool = False) -> None:
        self.orders = orders
        self.fail = fail
        self.reads: list[tuple[str, list[str], list[str]]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.gate = asyncio.Event()

    async def priors(
        self, sku: str, request_ids: Sequence[str], user_ids: Sequence[str]
    ) -> tuple[dict[str, Order], set[str]]:
        self.reads.append((sku, list(request_ids), list(user_ids)))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate.wait()
        finally:
            self.in_flight -= 1
        if self.fail:
            raise PostgresUnavailable("connection lost")
        made = {o.request_id: o for o in self.orders if o.request_id in request_ids}
        return made, {o.user_id for o in self.orders if o.sku == sku and o.user_id in user_ids}


def order(request_id: str, sku: str, user_id: str) -> Order:
    return Order(order_id="1", request_id=request_id, sku=sku, user_id=user_id, qty=1)


def lookups(rows: Rows, max_reads: int = 3) -> PriorLookups:
    return PriorLookups(cast(Orders, rows), max_reads=max_reads)


async def test_one_read_per_sku_for_the_purchases_asked_in_one_turn() -> None:
    """50 purchases of one sku and 10 of another asked at once: two reads, each
    of one sku's purchases, and each purchase gets its own answer: a replay its
    order, a repeat buyer "bought", a new buyer neither."""
    replayed = order("a.r1", "a", "u1")
    rows = Rows([replayed, order("a.r2", "a", "u2")])
    priors = lookups(rows)
    asked = [priors.prior("a", f"a.n{i}", f"n{i}") for i in range(48)]
    asked += [priors.prior("a", "a.r1", "u1"), priors.prior("a", "a.again", "u2")]
    asked += [priors.prior("b", f"b.n{i}", f"n{i}") for i in range(10)]
    rows.gate.set()
    answers = await asyncio.gather(*asked)

    assert [(sku, len(ids)) for sku, ids, _ in rows.reads] == [("a", 50), ("b", 10)]
    assert answers[:48] == [(None, False)] * 48
    assert answers[48:50] == [(replayed, True), (None, True)]
    assert answers[50:] == [(None, False)] * 10


async def test_reads_in_flight_bounded_the_rest_wait_for_one_read() -> None:
    """With one read in flight at most, the purchases asked while it runs wait,
    and the next read takes all of them at once."""
    rows = Rows([])
    priors = lookups(rows, max_reads=1)
    first = asyncio.ensure_future(priors.prior("a", "a.first", "first"))
    await wait_for(lambda: rows.in_flight == 1, within=5, what="the first read")
    later = [asyncio.ensure_future(priors.prior("a", f"a.n{i}", f"n{i}")) for i in range(20)]
    await asyncio.sleep(0)  # one loop turn: each of them asks
    rows.gate.set()
    await asyncio.gather(first, *later)

    assert [len(ids) for _, ids, _ in rows.reads] == [1, 20]
    assert rows.most_in_flight == 1


async def test_a_failed_read_fails_each_of_its_callers() -> None:
    """PostgreSQL fails the read: each purchase in it gets the error (a 503),
    none is left waiting."""
    rows = Rows([], fail=True)
    priors = lookups(rows)
    asked = [priors.prior("a", f"a.n{i}", f"n{i}") for i in range(5)]
    rows.gate.set()
    answers = await asyncio.gather(*asked, return_exceptions=True)

    assert all(isinstance(a, PostgresUnavailable) for a in answers)
    with pytest.raises(PostgresUnavailable):
        await priors.prior("a", "a.next", "next")


async def test_a_purchase_asked_as_the_last_read_ends_is_read() -> None:
    """A caller whose answer came asks again at once, before the read that
    answered it has left the reads in flight (its task's end is a callback
    queued behind the caller's wake-up): that key is read too. Before, with
    every read slot seen taken, nothing was started for it, and the purchase
    waited forever (a rebuild's storm hung a buyer on a loaded CI run)."""
    rows = Rows([])
    priors = lookups(rows, max_reads=1)

    async def buyer() -> list[tuple[Order | None, bool]]:
        first = await priors.prior("a", "a.r1", "u1")
        return [first, await priors.prior("a", "a.r2", "u2")]

    rows.gate.set()
    answers = await asyncio.wait_for(buyer(), timeout=5)

    assert answers == [(None, False), (None, False)]
    assert [ids for _, ids, _ in rows.reads] == [["a.r1"], ["a.r2"]]
