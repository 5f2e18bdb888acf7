"""A paid order refunded (issue 40), on real Redis and PostgreSQL under every
strategy: ``POST /v1/orders/{request_id}/refund`` takes a paid or confirmed
order to ``refunded``, once; with ``restock`` its unit is on sale again and
sold again exactly once, like an expiry's; without, it stays gone and the books
still balance; an order that is not paid is 409 ``order_not_paid``; and of a
refund racing a refund or a cancel, exactly one transition wins."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

import pytest

from gateway.domain.model import Strategy
from gateway.ops.audit import Finding, audit
from gateway.settings import Settings
from testkit.order_lifecycle import (
    PAY_HEADERS,
    available,
    balanced,
    books,
    cancel,
    pay,
    put_window,
    refund,
    start,
    status_of,
)
from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS, Client, buy, put_sku

STRATEGIES = [s.value for s in Strategy]
# Orders per race kind: refund against refund, and refund against cancel.
RACES = 500


async def paid_order(client: Client, sku: str, rid: str) -> None:
    """Buy one unit for the buyer ``rid`` under request id ``rid``, and pay it."""
    status, body = await buy(client, sku, rid, rid)
    assert status in (201, 202), body
    await wait_for(
        lambda: _is(status_of(client, sku, rid, rid), "pending_payment"), what=f"{rid} committed"
    )
    status, body = await pay(client, sku, rid, f"pay-{sku}-{rid}")
    assert status == 200, body


async def _is(value: Any, expected: str) -> bool:
    return bool(await value == expected)


async def clean_audit(settings: Settings, sku: str) -> bool:
    """The audit of ``sku`` finds nothing (Redis given every return too)."""
    [found] = await audit(settings, sku)
    return found.verdict is Finding.OK


class TestRefund:
    """One refund of a paid order, on every strategy."""

    @pytest.mark.parametrize("strategy", STRATEGIES)
    async def test_a_refund_with_restock_sells_the_unit_again_once(
        self,
        start_gateway: Any,
        make_settings: Callable[..., Settings],
        sku: str,
        database_url: str,
        strategy: str,
    ) -> None:
        """One unit, paid, refunded with restock: 200 refunded with its payment
        id; the unit is on sale again and of twenty buyers one gets it; the
        refund sent again answers the same and returns nothing more; one
        'refunded' movement; the books and Redis agree."""
        client = await start(start_gateway)
        await put_window(client, sku, 1, 60, strategy)
        await paid_order(client, sku, "ann")
        status, body = await refund(client, sku, "ann", restock=True, reason="returned unworn")
        assert status == 200, body
        assert body["status"] == "refunded" and body["payment_id"] == f"pay-{sku}-ann"
        await wait_for(lambda: available(client, sku), what="the unit back on sale")
        assert (await refund(client, sku, "ann", restock=True)) == (200, body)
        storm = await asyncio.gather(*(buy(client, sku, f"u{i}", f"s{i}") for i in range(20)))
        won = [i for i, (s, _) in enumerate(storm) if s in (201, 202)]
        assert len(won) == 1, collections.Counter(s for s, _ in storm)
        await wait_for(
            lambda: _is(status_of(client, sku, f"s{won[0]}", f"u{won[0]}"), "pending_payment"),
            what="the resale committed",
        )
        found = await books(database_url, sku)
        assert (found["stock"], found["movements_refunded"], found["refunded"]) == (0, 1, 1)
        assert balanced(found), found
        await wait_for(lambda: clean_audit(make_settings(), sku), what="a clean audit")

    @pytest.mark.parametrize("strategy", STRATEGIES)
    async def test_a_refund_without_restock_keeps_the_unit_gone(
        self,
        start_gateway: Any,
        make_settings: Callable[..., Settings],
        sku: str,
        database_url: str,
        strategy: str,
    ) -> None:
        """Two units, one paid and refunded without restock: the other unit
        alone is on sale, no movement, the refunded unit counts as gone in the
        books, and its buyer may buy again (a refunded order is not live)."""
        client = await start(start_gateway)
        await put_window(client, sku, 2, 60, strategy)
        await paid_order(client, sku, "bob")
        status, body = await refund(client, sku, "bob", restock=False)
        assert (status, body["status"]) == (200, "refunded")
        found = await books(database_url, sku)
        assert (found["stock"], found["refunded_kept"]) == (1, 1)
        assert "movements_refunded" not in found and balanced(found), found
        status, body = await buy(client, sku, "bob", "bob-again")
        assert status in (201, 202), body
        await wait_for(
            lambda: _is(status_of(client, sku, "bob-again", "bob"), "pending_payment"),
            what="the second order committed",
        )
        assert await available(client, sku) == 0
        await wait_for(lambda: clean_audit(make_settings(), sku), what="a clean audit")

    async def test_a_confirmed_order_is_refunded_too(self, start_gateway: Any, sku: str) -> None:
        """Without a window an order is final at its 201: it may be refunded,
        with no payment id to show."""
        client = await start(start_gateway)
        await put_sku(client, sku, 1, strategy="sql-direct")
        assert (await buy(client, sku, "cy", "cy"))[0] == 201
        status, body = await refund(client, sku, "cy", restock=True)
        assert (status, body["status"], body["payment_id"]) == (200, "refunded", None)
        assert await available(client, sku) == 1

    async def test_what_is_not_paid_is_not_refunded(self, start_gateway: Any, sku: str) -> None:
        """Pending, cancelled: 409 order_not_paid; unknown: 404; no token or the
        admin's on the payment route: 401; a body without restock: 400. After a
        refund, a cancel is 409 order_refunded, the refunded payment again 409
        order_refunded, and a new payment 409 order_refunded, recorded late."""
        client = await start(start_gateway)
        await put_window(client, sku, 5, 60, "sql-direct")
        for rid in ("p", "c", "r"):
            assert (await buy(client, sku, rid, rid))[0] == 201
        assert (await refund(client, sku, "p", restock=True))[1]["error"] == "order_not_paid"
        assert (await cancel(client, sku, "c"))[0] == 200
        status, body = await refund(client, sku, "c", restock=True)
        assert (status, body["error"]) == (409, "order_not_paid")
        assert (await refund(client, sku, "nope", restock=True))[0] == 404
        for headers in ({}, ADMIN_HEADERS):
            resp = await client.post(
                f"/v1/orders/{sku}.p/refund", json={"restock": True}, headers=headers
            )
            assert resp.status == 401
        for bad in ({}, {"restock": "yes"}, {"restock": True, "reason": ""}, {"x": 1}):
            resp = await client.post(f"/v1/orders/{sku}.p/refund", json=bad, headers=PAY_HEADERS)
            assert (resp.status, (await resp.json())["error"]) == (400, "invalid_request")
        await pay(client, sku, "r", f"pay-{sku}-r")
        assert (await refund(client, sku, "r", restock=True))[0] == 200
        assert (await cancel(client, sku, "r"))[1]["error"] == "order_refunded"
        assert (await pay(client, sku, "r", f"pay-{sku}-r"))[1]["error"] == "order_refunded"
        status, body = await pay(client, sku, "r", f"pay-{sku}-r2")
        assert (status, body["error"]) == (409, "order_refunded")
        resp = await client.get(
            "/v1/late-payments", params={"status": "owed", "limit": "1000"}, headers=PAY_HEADERS
        )
        late = [p for p in (await resp.json())["late_payments"] if p["request_id"] == f"{sku}.r"]
        assert [(p["payment_id"], p["reason"]) for p in late] == [(f"pay-{sku}-r2", "refunded")]

    async def test_an_admin_cancels_and_refunds_through_its_own_routes(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """POST /admin/orders/{id}/cancel and /refund take the admin token (the
        payment token is 401 there), answer as the payment routes do, and the
        order's change says cause admin."""
        client = await start(start_gateway)
        await put_window(client, sku, 2, 60, "sql-direct")
        await paid_order(client, sku, "dee")
        assert (await buy(client, sku, "eve", "eve"))[0] == 201
        resp = await client.post(f"/admin/orders/{sku}.eve/cancel", headers=PAY_HEADERS)
        assert resp.status == 401
        resp = await client.post(
            f"/admin/orders/{sku}.eve/cancel", json={"reason": "fraud"}, headers=ADMIN_HEADERS
        )
        assert (resp.status, (await resp.json())["status"]) == (200, "cancelled")
        resp = await client.post(
            f"/admin/orders/{sku}.dee/refund", json={"restock": True}, headers=ADMIN_HEADERS
        )
        assert (resp.status, (await resp.json())["status"]) == (200, "refunded")
        found = await books(database_url, sku)
        assert found["stock"] == 2 and balanced(found), found


class TestRaces:
    """Exactly one terminal transition wins, whatever arrives together."""

    async def test_refunds_race_refunds_and_cancels(
        self,
        start_gateway: Any,
        make_settings: Callable[..., Settings],
        sku: str,
        database_url: str,
    ) -> None:
        """RACES paid orders, each refunded twice at once (restock): both 200
        refunded, its unit back once. RACES pending orders, each paid, cancelled
        and refunded at once: it ends paid and refunded, or cancelled, never
        both; the refund is 200 only after the payment won. The stock, the
        movements, Redis and the audit agree."""
        client = await start(start_gateway)
        await put_window(client, sku, 2 * RACES, 120, "reserve-batch")
        for first in range(0, 2 * RACES, 100):
            answers = await asyncio.gather(
                *(buy(client, sku, f"u{i}", f"r{i}") for i in range(first, first + 100))
            )
            assert {s for s, _ in answers} == {201}, answers

        async def refunds(i: int) -> None:
            assert (await pay(client, sku, f"r{i}", f"pay-{sku}-{i}"))[0] == 200
            one, two = await asyncio.gather(
                refund(client, sku, f"r{i}", restock=True),
                refund(client, sku, f"r{i}", restock=True),
            )
            assert one == two and one[0] == 200 and one[1]["status"] == "refunded", (one, two)

        async def three_way(i: int) -> str:
            paid, cancelled, refunded = await asyncio.gather(
                pay(client, sku, f"r{i}", f"pay-{sku}-{i}"),
                cancel(client, sku, f"r{i}"),
                refund(client, sku, f"r{i}", restock=True),
            )
            if cancelled[0] == 200:
                assert paid[1]["error"] == "order_cancelled"
                assert refunded[1]["error"] == "order_not_paid"
                return "cancelled"
            assert paid[0] == 200 and cancelled[1]["error"] in ("order_paid", "order_refunded")
            if refunded[0] == 200:
                return "refunded"
            assert refunded[1]["error"] == "order_not_paid"
            return "paid"

        await asyncio.gather(*map(refunds, range(RACES)))
        ends = collections.Counter(await asyncio.gather(*map(three_way, range(RACES, 2 * RACES))))
        assert sum(ends.values()) == RACES
        found = await books(database_url, sku)
        back = RACES + ends["cancelled"] + ends["refunded"]
        assert found["stock"] == back, (found, ends)
        assert found["movements_refunded"] == RACES + ends["refunded"]
        assert found.get("movements_cancelled", 0) == ends["cancelled"]
        assert found.get("paid", 0) == ends["paid"] and balanced(found), found
        await wait_for(lambda: clean_audit(make_settings(), sku), what="a clean audit")
        assert await available(client, sku) == back
