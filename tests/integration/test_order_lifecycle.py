"""After the 201 (issue 31), on real Redis and PostgreSQL, under every strategy:
a sku with a payment window sells its units pending payment; pay, cancel and
expiry each end an order once; a unit that comes back is on sale again and
sold again exactly once; a late payment is refused, recorded, and takes no unit."""

from __future__ import annotations

import asyncio
import collections
import functools
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from gateway.domain.model import Strategy
from gateway.redis.layout import SkuKeys
from testkit import rooms
from testkit.order_lifecycle import (
    available,
    balanced,
    books,
    cancel,
    pay,
    put_window,
    start,
    status_of,
)
from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS, Client, buy, client_metric
from testkit.rooms import SECRET

STRATEGIES = [s.value for s in Strategy]


class TestWindow:
    """The sku's window and the 201 it gives."""

    async def test_a_window_answers_pending_payment_with_pay_by(
        self, start_gateway: Any, sku: str
    ) -> None:
        """201 pending_payment with pay_by; GET says the same; the sku reports its window."""
        client = await start(start_gateway)
        await put_window(client, sku, 3, 60)
        status, body = await buy(client, sku, "amy", "a1")
        assert status == 201 and body["status"] == "pending_payment"
        assert body["pay_by"].endswith("Z")
        resp = await client.get(f"/v1/orders/{sku}.a1", params={"user_id": "amy"})
        assert await resp.json() == body
        # A replay answers what the first answer said.
        assert await buy(client, sku, "amy", "a1") == (201, body)
        resp = await client.get(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)
        assert resp.status == 200

    async def test_without_a_window_the_order_is_confirmed(
        self, start_gateway: Any, sku: str
    ) -> None:
        """No window: 201 confirmed with pay_by null; paying or cancelling it is 409."""
        client = await start(start_gateway)
        await put_window(client, sku, 3, 0)
        status, body = await buy(client, sku, "bo", "b1")
        assert (status, body["status"], body["pay_by"]) == (201, "confirmed", None)
        assert (await pay(client, sku, "b1", "p1"))[1]["error"] == "no_payment_window"
        assert (await cancel(client, sku, "b1"))[1]["error"] == "no_payment_window"

    @pytest.mark.parametrize("window", [-1, 259_201, "60", None])
    async def test_a_bad_window_is_a_400(self, start_gateway: Any, sku: str, window: Any) -> None:
        """payment_window_s is an integer from 0 to 259200."""
        client = await start(start_gateway)
        body = {"stock": 1, "payment_window_s": window}
        resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
        assert resp.status == 400
        assert (await resp.json())["error"] == "invalid_request"

    async def test_a_window_needs_the_payment_token(self, start_gateway: Any, sku: str) -> None:
        """Without GATEWAY_PAYMENT_TOKEN nobody could pay: the window is refused (422)."""
        client = await start_gateway()
        body = {"stock": 1, "payment_window_s": 60}
        resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
        assert resp.status == 422
        assert (await resp.json())["error"] == "not_configured"

    async def test_the_payment_routes_need_their_own_token(
        self, start_gateway: Any, sku: str
    ) -> None:
        """No token, or the admin's, is 401; an unknown order is 404."""
        client = await start(start_gateway)
        await put_window(client, sku, 1, 60)
        await buy(client, sku, "cy", "c1")
        for headers in ({}, ADMIN_HEADERS):
            resp = await client.post(f"/v1/orders/{sku}.c1/cancel", headers=headers)
            assert resp.status == 401
        assert (await status_of(client, sku, "c1", "cy")) == "pending_payment"
        assert (await pay(client, sku, "nope", "p1"))[0] == 404
        assert (await cancel(client, sku, "nope"))[0] == 404


class TestRepeats:
    """A payment or a cancel sent again changes nothing more."""

    async def test_the_same_payment_ten_times_is_paid_once(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """Ten concurrent payments with one payment_id: all 200 paid, the order paid
        once; another payment_id is 409 already_paid, a cancel 409 order_paid."""
        client = await start(start_gateway)
        await put_window(client, sku, 2, 60)
        await buy(client, sku, "di", "d1")
        answers = await asyncio.gather(*(pay(client, sku, "d1", "pay-d1") for _ in range(10)))
        assert {(s, b["status"]) for s, b in answers} == {(200, "paid")}
        status, body = await pay(client, sku, "d1", "pay-other")
        assert (status, body["error"]) == (409, "already_paid")
        status, body = await cancel(client, sku, "d1")
        assert (status, body["error"]) == (409, "order_paid")
        found = await books(database_url, sku)
        assert (found["stock"], found["paid"]) == (1, 1) and balanced(found)

    async def test_a_payment_id_pays_one_order(self, start_gateway: Any, sku: str) -> None:
        """A payment id that paid one order is 409 payment_id_taken on another."""
        client = await start(start_gateway)
        await put_window(client, sku, 2, 60)
        await buy(client, sku, "li", "l1")
        await buy(client, sku, "mo", "m1")
        assert (await pay(client, sku, "l1", f"pay-{sku}"))[0] == 200
        status, body = await pay(client, sku, "m1", f"pay-{sku}")
        assert (status, body["error"]) == (409, "payment_id_taken")
        assert await status_of(client, sku, "m1", "mo") == "pending_payment"

    @pytest.mark.parametrize("strategy", STRATEGIES)
    async def test_a_cancel_ten_times_returns_one_unit(
        self, start_gateway: Any, sku: str, database_url: str, strategy: str
    ) -> None:
        """Ten concurrent cancels: the same 200 cancelled each time, one unit back
        on sale (PostgreSQL, Redis for the strategies that reserve, one movement)."""
        client = await start(start_gateway)
        await put_window(client, sku, 1, 60, strategy)
        status, _ = await buy(client, sku, "ed", "e1")
        assert status in (201, 202)
        await wait_for(
            lambda: _is(status_of(client, sku, "e1", "ed"), "pending_payment"), what="e1 committed"
        )
        assert await available(client, sku) == 0
        answers = await asyncio.gather(*(cancel(client, sku, "e1") for _ in range(10)))
        assert len({(s, repr(b)) for s, b in answers}) == 1
        assert answers[0][0] == 200 and answers[0][1]["status"] == "cancelled"
        found = await books(database_url, sku)
        assert (found["stock"], found["movements_cancelled"]) == (1, 1) and balanced(found)
        assert await available(client, sku) == 1
        # The buyer may buy again: only live orders count as bought.
        status, body = await buy(client, sku, "ed", "e2")
        assert status in (201, 202), body


class TestExpiry:
    """At pay_by an unpaid order expires and its unit is sold again, once."""

    @pytest.mark.parametrize("strategy", STRATEGIES)
    async def test_an_expired_unit_is_sold_again_exactly_once(
        self, start_gateway: Any, sku: str, database_url: str, strategy: str
    ) -> None:
        """One unit, a 1 s window: fay's order expires; the unit is on sale again;
        of twenty buyers one gets it; fay's payment then is 409 order_expired,
        recorded for a refund, and no unit is oversold."""
        client = await start(start_gateway)
        await put_window(client, sku, 1, 1, strategy)
        status, _ = await buy(client, sku, "fay", "f1")
        assert status in (201, 202)
        await wait_for(
            lambda: _is(status_of(client, sku, "f1", "fay"), "expired"),
            within=10,
            what="f1 expired",
        )
        await wait_for(lambda: available(client, sku), within=5, what="the unit back on sale")
        storm = await asyncio.gather(*(buy(client, sku, f"u{i}", f"s{i}") for i in range(20)))
        won = [i for i, (s, _) in enumerate(storm) if s in (201, 202)]
        assert len(won) == 1, collections.Counter(s for s, _ in storm)
        status, body = await pay(client, sku, "f1", f"pay-{sku}")
        assert (status, body["error"]) == (409, "order_expired")
        con = await asyncpg.connect(database_url)
        try:
            late = await con.fetchrow(
                "SELECT request_id, reason FROM late_payments WHERE payment_id = $1", f"pay-{sku}"
            )
        finally:
            await con.close()
        assert late is not None
        assert (late["request_id"], late["reason"]) == (f"{sku}.f1", "expired")
        resp = await client.get(
            "/admin/late-payments",
            params={"status": "owed", "limit": "1000"},
            headers=ADMIN_HEADERS,
        )
        assert resp.status == 200, await resp.text()
        listed = (await resp.json())["late_payments"]
        assert f"pay-{sku}" in [p["payment_id"] for p in listed]
        await wait_for(
            lambda: _is(status_of(client, sku, f"s{won[0]}", f"u{won[0]}"), "pending_payment"),
            what="the resale committed",
        )
        found = await books(database_url, sku)
        assert found["stock"] == 0 and found["movements_expired"] == 1
        assert found.get("pending_payment", 0) == 1 and balanced(found)

    @pytest.mark.parametrize("strategy", STRATEGIES)
    async def test_sold_out_while_held_says_how_many_and_when(
        self, start_gateway: Any, sku: str, strategy: str
    ) -> None:
        """Every unit held for payment: 409 sold_out with held and a Retry-After
        to the earliest deadline, again once the sku is marked sold out; a
        cancelled unit is then bought."""
        client = await start(start_gateway)
        await put_window(client, sku, 2, 30, strategy)
        for user in ("hal", "ivy"):
            assert (await buy(client, sku, user, user))[0] in (201, 202)
            await wait_for(functools.partial(_pending, client, sku, user), what=f"{user} committed")
        for _ in range(3):
            resp = await client.post("/v1/purchase", json={"sku": sku, "user_id": "jo"})
            assert resp.status == 409
            assert await resp.json() == {"status": "sold_out", "held": 2}
            assert 1 <= int(resp.headers["Retry-After"]) <= 30
        # A replay of a held order on the sku marked sold out answers its 201.
        status, body = await buy(client, sku, "hal", "hal")
        assert (status, body["status"]) == (201, "pending_payment") and body["pay_by"]
        assert (await cancel(client, sku, "hal"))[0] == 200
        await wait_for(
            lambda: _bought(buy(client, sku, "jo", "jo")), within=5, what="jo buys hal's unit"
        )
        await wait_for(
            lambda: _is(status_of(client, sku, "jo", "jo"), "pending_payment"), what="jo committed"
        )

        async def held_again() -> bool:
            resp = await client.post("/v1/purchase", json={"sku": sku, "user_id": "kim"})
            return resp.status == 409 and await resp.json() == {"status": "sold_out", "held": 2}

        await wait_for(held_again, within=5, what="jo's unit held")

    async def test_an_expired_buyer_buys_again(self, start_gateway: Any, sku: str) -> None:
        """gus's order expires; gus buys again and gets a new pending order."""
        client = await start(start_gateway)
        await put_window(client, sku, 1, 1)
        assert (await buy(client, sku, "gus", "g1"))[0] == 201
        await wait_for(
            lambda: _is(status_of(client, sku, "g1", "gus"), "expired"),
            within=10,
            what="g1 expired",
        )
        status, body = await wait_for(
            lambda: _bought(buy(client, sku, "gus", "g2")), within=5, what="gus again"
        )
        assert body["status"] == "pending_payment"
        status, body = await cancel(client, sku, "g1")
        assert (status, body["error"]) == (409, "order_expired")

    async def test_an_expired_buyer_buys_again_after_redis_lost_the_sale(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """gus's order expires, then Redis loses the sale: the rebuild takes live
        orders only, so gus buys again, once, and is a duplicate after that."""
        client = await start(start_gateway)
        await put_window(client, sku, 3, 1)
        assert (await buy(client, sku, "gus", "g1"))[0] == 201
        await wait_for(
            lambda: _is(status_of(client, sku, "g1", "gus"), "expired"),
            within=10,
            what="g1 expired",
        )
        for key in await redis.keys(f"{key_prefix}:{{{sku}}}:*"):
            await redis.delete(key)
        await wait_for(lambda: _bought(buy(client, sku, "gus", "g2")), within=5, what="gus again")
        keys = SkuKeys.of(key_prefix, sku)

        async def rebuilt() -> bool:
            return not await redis.exists(keys.rebuild)

        await wait_for(rebuilt, within=10, what="the sale's hashes rebuilt")
        assert await redis.hget(keys.buyers, "gus") == f"{sku}.g2".encode()
        assert await buy(client, sku, "gus", "g3") == (409, {"status": "duplicate"})

    async def test_two_gateways_sweep_the_same_deadlines(
        self, start_gateway: Any, sku: str, database_url: str, redis: Redis, key_prefix: str
    ) -> None:
        """Two gateways sweep one sku's 40 orders due at once: each is expired and
        returned once (40 movements, 40 units back in PostgreSQL and in Redis,
        40 return lags observed between the two)."""
        one = await start(start_gateway)
        two = await start(start_gateway)
        await put_window(one, sku, 40, 1)
        bought = await asyncio.gather(
            *(buy(one if i % 2 else two, sku, f"b{i}", f"r{i}") for i in range(40))
        )
        assert {s for s, _ in bought} == {201}

        async def all_back() -> bool:
            found = await books(database_url, sku)
            return found.get("expired") == 40 and await available(one, sku) == 40

        await wait_for(all_back, within=10, what="40 expired and back")
        found = await books(database_url, sku)
        assert (found["stock"], found["movements_expired"]) == (40, 40) and balanced(found)
        keys = SkuKeys.of(key_prefix, sku)
        assert await redis.get(keys.stock) == b"40"
        assert await redis.hlen(keys.returned) == 40
        assert await redis.hlen(keys.buyers) == 0
        # Each return was observed once, by the gateway that made it (the sweep
        # is the database's: earlier tests' orders due meanwhile count too).
        lags = [
            await client_metric(c, "flashsale_order_return_lag_seconds_count") for c in (one, two)
        ]
        closed = [await client_metric(c, "flashsale_orders_closed_total") for c in (one, two)]
        assert sum(lags) >= 40 and sum(closed) >= 40


async def _is(value: Any, expected: str) -> bool:
    return bool(await value == expected)


async def _pending(client: Client, sku: str, rid: str) -> bool:
    """Whether the order of ``rid``, bought by the user of the same name, is pending."""
    return await status_of(client, sku, rid, rid) == "pending_payment"


async def _bought(answer: Any) -> tuple[int, Any] | None:
    status, body = await answer
    return (status, body) if status in (201, 202) else None


class TestWaitingRoom:
    """A waiting room keeps its line while units are held for payment."""

    async def test_a_returned_unit_admits_the_next_ticket(
        self, start_gateway: Any, sku: str
    ) -> None:
        """One unit, held by ann: bob's join is a ticket, not sold out, and he
        waits; ann's order is cancelled and bob is let in and buys the unit;
        once bob paid, nothing is held or left and the room ends as sold out."""
        client = await start(start_gateway, admission_secret=SECRET)
        body = {
            "stock": 1,
            "payment_window_s": 60,
            "waiting_room": {"admit_per_s": 100, "token_ttl_s": 60},
        }
        resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
        assert resp.status == 200, await resp.text()
        _, ann = await rooms.join(client, sku, "ann")
        token = await rooms.admitted_token(client, sku, ann["ticket"])
        assert (await rooms.buy_with(client, sku, "ann", token, "ann"))[0] == 201
        status, bob = await rooms.join(client, sku, "bob")
        assert status == 200, bob
        assert (await rooms.poll(client, sku, bob["ticket"]))["status"] == "waiting"
        assert (await cancel(client, sku, "ann"))[0] == 200
        token = await rooms.admitted_token(client, sku, bob["ticket"])
        status, order = await rooms.buy_with(client, sku, "bob", token, "bob")
        assert (status, order["status"]) == (201, "pending_payment")
        assert (await pay(client, sku, "bob", f"pay-{sku}"))[0] == 200

        async def ended() -> bool:
            return (await rooms.join(client, sku, "cy")) == (409, {"status": "sold_out"})

        await wait_for(ended, within=5, what="the room ended")

    @pytest.mark.parametrize(("closed_as", "window_s"), [("cancelled", 60), ("expired", 1)])
    async def test_a_buyer_whose_order_closed_joins_again_at_the_back(
        self, start_gateway: Any, sku: str, closed_as: str, window_s: int
    ) -> None:
        """Ann's order is cancelled or expires: her spent turn is not given back
        (her token still answers 403), but she may buy again: joining gives her
        a new ticket at the back of the line at once, not the spent one, and
        its token buys."""
        client = await start(start_gateway, admission_secret=SECRET)
        body = {
            "stock": 2,
            "payment_window_s": window_s,
            "waiting_room": {"admit_per_s": 100, "token_ttl_s": 60},
        }
        resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
        assert resp.status == 200, await resp.text()
        _, first = await rooms.join(client, sku, "ann")
        token = await rooms.admitted_token(client, sku, first["ticket"])
        assert (await rooms.buy_with(client, sku, "ann", token, "ann"))[0] == 201
        if closed_as == "cancelled":
            assert (await cancel(client, sku, "ann"))[0] == 200

        async def rejoined() -> dict[str, Any] | None:
            status, again = await rooms.join(client, sku, "ann")
            assert status == 200, again
            return again if again["ticket"] != first["ticket"] else None

        again = await wait_for(rejoined, within=10, what="ann's new ticket")
        assert await status_of(client, sku, "ann", "ann") == closed_as
        assert again["position"] >= 1
        status, refused = await rooms.buy_with(client, sku, "ann", token, "ann-retry")
        assert (status, refused["error"]) == (403, "admission_invalid")
        token = await rooms.admitted_token(client, sku, again["ticket"])
        status, order = await rooms.buy_with(client, sku, "ann", token, "ann-again")
        assert (status, order["status"]) == (201, "pending_payment")
