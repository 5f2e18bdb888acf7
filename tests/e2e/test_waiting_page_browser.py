"""The waiting-room page in a real browser (Debian's chromium, via Playwright),
against a real gateway on the shared Redis and PostgreSQL.

Each test opens ``/wait/{sku}?user_id=...`` as a buyer would and waits, with
bounded timeouts, on ``#waiting-room``'s ``data-state``. Rooms let people in at
``admit_per_s`` a second, and a queue this short is told to poll again after
1 s, so a whole wait takes a few seconds and no test sleeps.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from playwright.async_api import Route
from redis.asyncio import Redis

from gateway.http.waiting_page import PAGES_DIR
from gateway.redis.layout import RoomKeys
from testkit.browser import Buyer
from testkit.purchases import ADMIN_HEADERS, Client, buy, orders_of, put_sku
from testkit.rooms import SECRET, join, put_room_sku
from tests.e2e.conftest import PHONE, OpenBuyer

# The first browser test's set-up may install chromium with apt-get (minutes on
# a fresh machine); each test's own waits are bounded by STATE_WITHIN_S.
pytestmark = pytest.mark.timeout(600)

StartGateway = Callable[..., Awaitable[Client]]
# WAITING_PAGE_SHOTS=docs saves the happy path's waiting, admitted and confirmed
# screenshots there: docs/waiting-page.md's pictures are taken by this test.
SHOTS_DIR = os.environ.get("WAITING_PAGE_SHOTS")
# What the page says, by name: the tests read its words where it does.
TEXTS: dict[str, str] = orjson.loads((PAGES_DIR / "texts.json").read_bytes())
PAYMENT_TOKEN = "test-payment-token"
# A shop's payment page: only linked to, never loaded, so no request leaves the gateway.
SHOP = "https://shop.example"


async def gateway(start_gateway: StartGateway, **settings: Any) -> tuple[Client, str]:
    """A gateway that can sign admission tokens; its client and its origin."""
    client = await start_gateway(admission_secret=SECRET, **settings)
    return client, str(client.make_url("")).rstrip("/")


def assert_clean(buyer: Buyer, answered: tuple[int, ...] = ()) -> None:
    """No request left the gateway's origin; no script error; no console error
    but Chromium's own line for each error status ``answered`` (it logs every
    fetch answered 4xx or 5xx, however the page handles it)."""
    assert buyer.foreign_requests() == []
    assert buyer.page_errors == []
    logged = [
        f"Failed to load resource: the server responded with a status of {status} "
        for status in answered
    ]
    assert [e[: len(w)] for e, w in zip(buyer.console_errors, logged, strict=False)] == logged
    assert len(buyer.console_errors) == len(logged), buyer.console_errors


class QueueCalls:
    """Every call the page makes to ``/v1/queue``, intercepted: when it was made,
    and what it was told; the first ``fail`` polls are answered 503 instead."""

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.calls: list[tuple[float, str, int, dict[str, Any]]] = []

    async def handle(self, route: Route) -> None:
        at, method = time.monotonic(), route.request.method
        if method == "GET" and self.fail > 0:
            self.fail -= 1
            body = {"error": "unavailable", "detail": "try later"}
            self.calls.append((at, method, 503, body))
            await route.fulfill(
                status=503, headers={"Retry-After": "1"}, json=body, content_type="application/json"
            )
            return
        response = await route.fetch()
        body = await response.json()
        self.calls.append((at, method, response.status, body))
        await route.fulfill(response=response)

    def polls_paced(self) -> None:
        """Each call came no sooner than the one before it asked for (``poll_after_s``,
        or ``Retry-After`` after a 503)."""
        for (at, _, status, body), (next_at, *_) in zip(self.calls, self.calls[1:], strict=False):
            if status == 503:
                asked = 1.0
            elif body.get("position", 1) == 0 or body.get("status") == "admitted":
                continue
            else:
                asked = float(body["poll_after_s"])
            assert next_at - at >= asked - 0.05, (asked, next_at - at)


class TestWaitAndBuy:
    """A buyer's whole way through the page: wait, admission, purchase."""

    async def test_buyer_behind_three_sees_place_fall_is_admitted_and_buys(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """On a 320 px phone, a buyer who joins behind three others is told place 4,
        then a smaller one, at the pace the API asks for; is let in with an enabled
        Buy button; buys; sees the order, which is the one row in PostgreSQL. No
        request leaves the gateway's origin; the console stays clean."""
        client, origin = await gateway(start_gateway)
        await put_room_sku(client, sku, stock=10, admit_per_s=2)
        for i in range(3):
            assert (await join(client, sku, f"ahead{i}"))[0] == 200
        buyer = await buyers(origin, viewport=PHONE)
        calls = QueueCalls()
        await buyer.page.route("**/v1/queue/**", calls.handle)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("waiting")
        assert await buyer.attr("position") == "4"
        assert "4" in await buyer.text("#wr-status")
        await buyer.page.wait_for_selector('#waiting-room[data-position="2"]', timeout=10_000)
        await buyer.snap("waiting")
        await buyer.reach("admitted")
        assert await buyer.page.is_enabled("button#buy")
        # Readable on a phone: nothing wider than the screen.
        assert await buyer.page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        await buyer.page.click("button#buy")
        await buyer.reach("confirmed")
        order_id = await buyer.attr("order-id")
        assert order_id and order_id in await buyer.text("#waiting-room")
        assert await orders_of(database_url, sku) == 1
        calls.polls_paced()
        assert_clean(buyer)
        if SHOTS_DIR:
            for state, png in buyer.shots:
                if state in ("waiting", "admitted", "confirmed"):
                    (Path(SHOTS_DIR) / f"waiting-page-{state}.png").write_bytes(png)

    async def test_reload_while_waiting_keeps_the_ticket_and_place(
        self,
        start_gateway: StartGateway,
        buyers: OpenBuyer,
        sku: str,
        redis: Redis,
        key_prefix: str,
    ) -> None:
        """A reload while waiting finds the same ticket: the buyer is still in
        line, no further back, and the room holds no second ticket for them."""
        client, origin = await gateway(start_gateway)
        await put_room_sku(client, sku, stock=10, admit_per_s=1)
        for i in range(5):
            assert (await join(client, sku, f"ahead{i}"))[0] == 200
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("waiting")
        keys = RoomKeys.of(key_prefix, sku)
        ticket = await redis.hget(keys.users, "buyer")
        before = int(await buyer.attr("position") or 0)
        await buyer.page.reload()
        await buyer.reach("waiting")
        after = int(await buyer.attr("position") or 0)
        assert 1 <= after <= before <= 6
        assert await redis.hget(keys.users, "buyer") == ticket
        assert await redis.hlen(keys.users) == 6
        assert_clean(buyer)

    async def test_reload_and_double_click_after_buying_never_buy_twice(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """A double click on Buy sends one purchase; a reload after it shows the
        same order without buying again: one order row."""
        client, origin = await gateway(start_gateway)
        await put_room_sku(client, sku, stock=10, admit_per_s=100)
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("admitted")
        await buyer.page.dblclick("button#buy")
        await buyer.reach("confirmed")
        order_id = await buyer.attr("order-id")
        sent = len(buyer.requests)
        await buyer.page.reload()
        await buyer.reach("confirmed")
        assert await buyer.attr("order-id") == order_id
        purchases = [u for u in buyer.requests if u.endswith("/v1/purchase")]
        assert len(purchases) == 1 and not any(
            u.endswith("/v1/purchase") for u in buyer.requests[sent:]
        )
        assert await orders_of(database_url, sku) == 1
        assert_clean(buyer)


class TestSkusOfEveryKind:
    """What the page shows for a sku without a room, sold out, or not yet on sale."""

    async def test_sku_without_room_goes_straight_to_admitted(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """A sku with no waiting room: no queue, the Buy button at once, and it buys."""
        client, origin = await gateway(start_gateway)
        await put_sku(client, sku, 3)
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("admitted")
        await buyer.page.click("button#buy")
        await buyer.reach("confirmed")
        assert await buyer.attr("order-status") == "confirmed"
        assert await buyer.page.is_hidden("a#pay") and await buyer.text("#wr-deadline") == ""
        assert not any("/v1/queue/" in u for u in buyer.requests)
        assert await orders_of(database_url, sku) == 1
        assert_clean(buyer)

    async def test_sold_out_skus_show_sold_out(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str
    ) -> None:
        """A sold-out sku shows sold out, with a room or without, and no Buy button."""
        client, origin = await gateway(start_gateway)
        await put_room_sku(client, sku, stock=0)
        plain = f"{sku}-plain"
        await put_sku(client, plain, 0)
        for name in (sku, plain):
            buyer = await buyers(origin)
            await buyer.open(f"/wait/{name}?user_id=buyer")
            await buyer.reach("sold_out")
            assert await buyer.page.is_hidden("button#buy")
            assert_clean(buyer, answered=(409,) if name == sku else ())

    async def test_window_not_yet_open_counts_down_then_lets_in(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str
    ) -> None:
        """Before ``starts_at`` the page shows not_started, the start and a
        countdown; once the window opens the buyer is let in."""
        client, origin = await gateway(start_gateway)
        starts = datetime.now(UTC) + timedelta(seconds=3)
        body = {
            "stock": 5,
            "starts_at": starts.isoformat(),
            "waiting_room": {"admit_per_s": 100, "token_ttl_s": 60},
        }
        resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
        assert resp.status == 200, await resp.text()
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("not_started")
        shown = datetime.fromisoformat(str(await buyer.attr("starts-at")).replace("Z", "+00:00"))
        assert abs((shown - starts).total_seconds()) < 0.01
        assert " s" in await buyer.text("#wr-eta")
        await buyer.reach("admitted", within=15)
        assert datetime.now(UTC) >= starts
        assert_clean(buyer)

    async def test_window_opening_in_a_month_keeps_counting_down(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str
    ) -> None:
        """A start further off than a browser timer reaches (2^31 ms, about 24 days)
        is counted down in days, and the page keeps waiting: nothing is bought
        while the countdown ticks."""
        client, origin = await gateway(start_gateway)
        starts = datetime.now(UTC) + timedelta(days=30)
        body = {"stock": 5, "starts_at": starts.isoformat()}
        resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
        assert resp.status == 200, await resp.text()
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("not_started")
        for _ in range(2):
            shown = await buyer.text("#wr-eta")
            await buyer.page.wait_for_function(
                "(shown) => document.getElementById('wr-eta').textContent !== shown",
                arg=shown,
                timeout=5_000,
            )
        assert (await buyer.text("#wr-eta")).startswith(TEXTS["countdown"].split("{")[0] + "29 d")
        assert await buyer.attr("state") == "not_started"
        assert not any(u.endswith("/v1/purchase") for u in buyer.requests)
        assert_clean(buyer)


class TestFaults:
    """The page rides out what the API says is temporary."""

    async def test_503s_while_polling_are_ridden_out(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str
    ) -> None:
        """Two polls answered 503 with Retry-After: 1 are retried no sooner than a
        second later, the page stays in line (never error), then is let in."""
        client, origin = await gateway(start_gateway)
        await put_room_sku(client, sku, stock=5, admit_per_s=1)
        assert (await join(client, sku, "ahead"))[0] == 200
        buyer = await buyers(origin)
        calls = QueueCalls(fail=2)
        await buyer.page.route("**/v1/queue/**", calls.handle)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("waiting")
        await buyer.reach("admitted")
        assert [c[2] for c in calls.calls].count(503) == 2
        calls.polls_paced()
        assert_clean(buyer, answered=(503, 503))

    async def test_purchase_answered_503_shows_detail_and_retries_same_request(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """A purchase answered 503 shows the API's detail and a Try again button
        (enabled after Retry-After); trying again sends the same request id and
        buys once."""
        client, origin = await gateway(start_gateway)
        await put_room_sku(client, sku, stock=5)
        buyer = await buyers(origin)
        sent: list[str] = []

        async def purchase(route: Route) -> None:
            sent.append(orjson.loads(route.request.post_data or "{}")["request_id"])
            if len(sent) == 1:
                body = {"error": "unavailable", "detail": "flush queue full"}
                headers = {"Retry-After": "1"}
                await route.fulfill(status=503, headers=headers, json=body)
            else:
                await route.continue_()

        await buyer.page.route("**/v1/purchase", purchase)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("admitted")
        await buyer.page.click("button#buy")
        await buyer.reach("error")
        assert "flush queue full" in await buyer.text("#wr-note")
        await buyer.page.click("button#retry", timeout=5_000)  # waits until enabled
        await buyer.reach("confirmed")
        assert len(sent) == 2 and sent[0] == sent[1]
        assert await orders_of(database_url, sku) == 1
        assert_clean(buyer, answered=(503,))


class TestReturnTo:
    """A shop with its own checkout gets the admitted buyer back, with the token."""

    async def test_admitted_buyer_is_sent_to_the_shop_with_the_token(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str
    ) -> None:
        """With ``return_to`` on an allowed origin, admission sends the browser
        there, the admission token in the URL fragment (never to a server)."""
        shop_app = web.Application()

        async def shop(request: web.Request) -> web.Response:
            return web.Response(text="<!doctype html><title>shop</title>", content_type="text/html")

        shop_app.router.add_get("/checkout", shop)
        async with TestServer(shop_app) as shop_server:
            shop_origin = str(shop_server.make_url("")).rstrip("/")
            client, origin = await gateway(
                start_gateway, waiting_page_return_origins=frozenset({shop_origin})
            )
            await put_room_sku(client, sku, stock=5)
            buyer = await buyers(origin)
            await buyer.open(f"/wait/{sku}?user_id=buyer&return_to={shop_origin}/checkout")
            await buyer.page.wait_for_url(f"{shop_origin}/checkout#*", timeout=15_000)
            fragment = buyer.page.url.split("#", 1)[1]
            fields = dict(part.split("=", 1) for part in fragment.split("&"))
            assert fields["sku"] == sku and fields["user_id"] == "buyer"
            assert fields["admission_token"].count(".") == 2


async def put_window(client: Client, sku: str, stock: int, window_s: int) -> None:
    """Create the sku with a payment window of ``window_s`` seconds."""
    body = {"stock": stock, "payment_window_s": window_s}
    resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
    assert resp.status == 200, await resp.text()


async def order_of(client: Client, rid: str) -> dict[str, Any]:
    """``GET /v1/orders/{request_id}``'s order (asserts a 200)."""
    resp = await client.get(f"/v1/orders/{rid}")
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def bought(buyer: Buyer, sku: str) -> str:
    """Click Buy on an admitted page; the request id the page bought under."""
    await buyer.reach("admitted")
    await buyer.page.click("button#buy")
    await buyer.reach("confirmed")
    rid = await buyer.page.evaluate(
        "(key) => sessionStorage.getItem(key)", f"waiting-room:{sku}:buyer:request_id"
    )
    assert isinstance(rid, str)
    return rid


class TestPaymentWindow:
    """An order with a payment window: its deadline, a countdown and the shop's
    pay link, then expired, or paid."""

    async def test_pending_order_counts_down_links_to_pay_and_expires_by_itself(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """A 201 pending payment shows the order's pay_by, a countdown in words
        that ticks, and a Pay link to the shop's pay_to with the request id. At
        the deadline the page says, by itself, that the order expired (as the API
        does), drops the link and, the unit being back on sale, offers to try
        again: which buys again under a new request id."""
        client, origin = await gateway(
            start_gateway,
            payment_token=PAYMENT_TOKEN,
            expiry_sweep_s=0.05,
            waiting_page_return_origins=frozenset({SHOP}),
        )
        await put_window(client, sku, stock=1, window_s=5)
        buyer = await buyers(origin, viewport=PHONE)
        await buyer.open(f"/wait/{sku}?user_id=buyer&pay_to={SHOP}/pay")
        rid = await bought(buyer, sku)
        assert await buyer.attr("order-status") == "pending_payment"
        assert await buyer.text("#wr-status") == TEXTS["pending"]
        order = await order_of(client, rid)
        pay_by = datetime.fromisoformat(order["pay_by"])
        shown = datetime.fromisoformat(str(await buyer.attr("pay-by")).replace("Z", "+00:00"))
        assert abs((shown - pay_by).total_seconds()) < 0.001
        assert await buyer.page.get_attribute("a#pay", "href") == f"{SHOP}/pay?request_id={rid}"
        assert await buyer.page.is_visible("a#pay")
        first = await buyer.text("#wr-deadline")
        assert first.endswith(" s left.")
        await buyer.page.wait_for_function(
            "(first) => document.getElementById('wr-deadline').textContent !== first",
            arg=first,
            timeout=5_000,
        )
        await buyer.snap("pay")
        await buyer.reach("expired")
        assert await buyer.attr("order-status") == "expired"
        assert await buyer.text("#wr-status") == TEXTS["expired"]
        assert await buyer.page.is_hidden("a#pay")
        assert (await order_of(client, rid))["status"] == "expired"
        await buyer.page.wait_for_selector("button#retry:enabled", timeout=10_000)
        assert await buyer.text("#wr-eta") == TEXTS["again"]
        await buyer.snap("expired")
        await buyer.page.click("button#retry")
        again = await bought(buyer, sku)
        assert again != rid and await buyer.attr("order-status") == "pending_payment"
        assert await orders_of(database_url, sku) == 2
        assert_clean(buyer)
        if SHOTS_DIR:
            for state, png in buyer.shots:
                if state in ("pay", "expired"):
                    (Path(SHOTS_DIR) / f"waiting-page-{state}.png").write_bytes(png)

    async def test_reload_shows_the_pending_order_then_paid_after_payment(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """A reload of a pending order looks it up and shows the same order and
        deadline, buying nothing; once the payment service pays it, a reload shows
        it paid, without a countdown or a Pay link."""
        client, origin = await gateway(
            start_gateway,
            payment_token=PAYMENT_TOKEN,
            waiting_page_return_origins=frozenset({SHOP}),
        )
        await put_window(client, sku, stock=3, window_s=600)
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer&pay_to={SHOP}/pay")
        rid = await bought(buyer, sku)
        order_id, pay_by = await buyer.attr("order-id"), await buyer.attr("pay-by")
        await buyer.page.reload()
        await buyer.reach("confirmed")
        assert await buyer.attr("order-status") == "pending_payment"
        assert (await buyer.attr("order-id"), await buyer.attr("pay-by")) == (order_id, pay_by)
        assert "min" in await buyer.text("#wr-deadline")
        resp = await client.post(
            f"/v1/orders/{rid}/pay",
            json={"payment_id": "pay-1"},
            headers={"Authorization": f"Bearer {PAYMENT_TOKEN}"},
        )
        assert resp.status == 200 and (await resp.json())["status"] == "paid"
        await buyer.page.reload()
        await buyer.page.wait_for_selector(
            '#waiting-room[data-order-status="paid"]', timeout=15_000
        )
        assert await buyer.attr("state") == "confirmed"
        assert await buyer.text("#wr-status") == TEXTS["paid"]
        assert await buyer.page.is_hidden("a#pay") and await buyer.text("#wr-deadline") == ""
        assert order_id and order_id in await buyer.text("#wr-eta")
        assert len([u for u in buyer.requests if u.endswith("/v1/purchase")]) == 1
        assert await orders_of(database_url, sku) == 1
        assert_clean(buyer)

    async def test_cancel_shows_when_the_tab_is_shown_again(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str
    ) -> None:
        """An order cancelled by the payment service while its page is open shows
        as cancelled, in words, as soon as the tab is shown again (the page looks
        the order up then, not only every 30 s), with Try again offered."""
        client, origin = await gateway(start_gateway, payment_token=PAYMENT_TOKEN)
        await put_window(client, sku, stock=2, window_s=600)
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        rid = await bought(buyer, sku)
        resp = await client.post(
            f"/v1/orders/{rid}/cancel", headers={"Authorization": f"Bearer {PAYMENT_TOKEN}"}
        )
        assert resp.status == 200 and (await resp.json())["status"] == "cancelled"
        await buyer.page.evaluate("document.dispatchEvent(new Event('visibilitychange'))")
        await buyer.reach("expired", within=5)
        assert await buyer.attr("order-status") == "cancelled"
        assert await buyer.text("#wr-status") == TEXTS["cancelled"]
        await buyer.page.wait_for_selector("button#retry:enabled", timeout=10_000)
        assert_clean(buyer)

    async def test_sold_out_while_held_offers_to_try_again_at_the_deadline(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """A buyer who clicks Buy when the last unit is held for another buyer's
        payment is told it is sold out for now, with how many are held, and a Try
        again button enabled once the deadline passed: the unit not paid for is
        back on sale, and trying again buys it."""
        client, origin = await gateway(
            start_gateway, payment_token=PAYMENT_TOKEN, expiry_sweep_s=0.05
        )
        await put_window(client, sku, stock=1, window_s=3)
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("admitted")
        assert (await buy(client, sku, "other"))[1]["status"] == "pending_payment"
        await buyer.page.click("button#buy")
        await buyer.reach("sold_out")
        assert await buyer.attr("held") == "1"
        assert await buyer.text("#wr-status") == TEXTS["sold_out_held"].replace("{held}", "1")
        assert await buyer.page.is_disabled("button#retry")
        await buyer.page.click("button#retry", timeout=10_000)  # waits until enabled
        rid = await bought(buyer, sku)
        assert (await order_of(client, rid))["user_id"] == "buyer"
        assert await orders_of(database_url, sku) == 2
        assert_clean(buyer, answered=(409,))

    async def test_expired_order_in_a_room_joins_the_line_again(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """A sku with a waiting room: an order not paid in time is said expired.
        Try again finds the buyer's turn in line still open but spent by that
        order (a turn buys once): the page says so, counts down to the turn's
        end, joins the line again and buys the unit that came back."""
        client, origin = await gateway(
            start_gateway, payment_token=PAYMENT_TOKEN, expiry_sweep_s=0.05
        )
        body = {
            "stock": 1,
            "payment_window_s": 2,
            "waiting_room": {"admit_per_s": 100, "token_ttl_s": 5},
        }
        resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
        assert resp.status == 200, await resp.text()
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        rid = await bought(buyer, sku)
        await buyer.reach("expired")
        await buyer.page.click("button#retry", timeout=10_000)
        await buyer.reach("admitted")
        await buyer.page.click("button#buy")
        await buyer.page.wait_for_selector(
            f'#wr-status:text-is("{TEXTS["rejoin"]}")', timeout=10_000
        )
        again = await bought(buyer, sku)
        assert again != rid and (await order_of(client, again))["status"] == "pending_payment"
        assert await orders_of(database_url, sku) == 2
        assert_clean(buyer, answered=(403,))
