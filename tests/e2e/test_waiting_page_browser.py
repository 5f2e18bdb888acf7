"""The waiting-room page in a real browser (Debian's chromium, via Playwright),
against a real gateway on the shared Redis and PostgreSQL.

Each test opens ``/wait/{sku}?user_id=...`` as a buyer would and waits, with
bounded timeouts, on ``#waiting-room``'s ``data-state``. Rooms let people in at
``admit_per_s`` a second, and a queue this short is told to poll again after
1 s, so a whole wait takes a few seconds and no test sleeps.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from playwright.async_api import Route
from redis.asyncio import Redis

from gateway.redis.layout import RoomKeys
from testkit.browser import TEXTS, StartGateway, assert_clean, gateway
from testkit.purchases import ADMIN_HEADERS, orders_of, put_sku
from testkit.rooms import join, put_room_sku
from testkit.siteverify import siteverify
from tests.e2e.conftest import PHONE, OpenBuyer

# The first browser test's set-up may install chromium with apt-get (minutes on
# a fresh machine); each test's own waits are bounded by STATE_WITHIN_S.
pytestmark = pytest.mark.timeout(600)

# WAITING_PAGE_SHOTS=docs saves the happy path's waiting, admitted and confirmed
# screenshots there: docs/waiting-rooms.md's pictures are taken by this test.
SHOTS_DIR = os.environ.get("WAITING_PAGE_SHOTS")


class QueueCalls:
    """Every call the page makes to ``/v1/queue``, intercepted: when it was made,
    and what it was told; the first ``fail`` polls are answered 503 instead, and
    with ``hold`` every poll waits until it is set (a poll lets people in)."""

    def __init__(self, fail: int = 0, hold: asyncio.Event | None = None) -> None:
        self.fail, self.hold = fail, hold
        self.calls: list[tuple[float, str, int, dict[str, Any]]] = []

    async def handle(self, route: Route) -> None:
        at, method = time.monotonic(), route.request.method
        if method == "GET" and self.hold is not None:
            await self.hold.wait()
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
        # Polls wait until place 4 was read: the page's first poll lets two in
        # (admit_per_s), and on a slow machine it came before the read.
        polls = asyncio.Event()
        calls = QueueCalls(hold=polls)
        await buyer.page.route("**/v1/queue/**", calls.handle)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("waiting")
        assert await buyer.attr("position") == "4"
        assert "4" in await buyer.text("#wr-status")
        polls.set()
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
        same order without buying again, looked up as its buyer: one order row."""
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
        lookups = [u for u in buyer.requests[sent:] if "/v1/orders/" in u]
        assert lookups and all(u.endswith("?user_id=buyer") for u in lookups), lookups
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

    async def test_queued_purchase_is_followed_to_its_order(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """A sku of the queue strategy answers the purchase 202: the page long
        polls the order lookup as its buyer, with an unguessable request id
        (128 random bits), until the order is confirmed."""
        client, origin = await gateway(start_gateway)
        await put_sku(client, sku, 3, strategy="queue")
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("admitted")
        await buyer.page.click("button#buy")
        await buyer.reach("confirmed")
        lookups = [u for u in buyer.requests if "/v1/orders/" in u]
        assert lookups and all(u.endswith("?user_id=buyer&wait=20") for u in lookups), lookups
        assert re.search(r"/v1/orders/wr-[0-9a-f]{32}\?", lookups[0]), lookups[0]
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
        await put_sku(
            client,
            sku,
            5,
            starts_at=starts.isoformat(),
            waiting_room={"admit_per_s": 100, "token_ttl_s": 60},
        )
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("not_started", audit=False)  # for 3 s
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
        await put_sku(client, sku, 5, starts_at=starts.isoformat())
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("not_started")
        await buyer.ticks("#wr-eta", 2)
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


class TestBotCheck:
    """A room that checks for bots: the page passes on the bot token it was given."""

    async def test_a_page_opened_with_a_bot_token_joins_with_it(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str
    ) -> None:
        """Opened with ``?bot_token=``, the page joins with that token (the
        provider is asked about it once), drops it from its address, and is let
        in; opened without one, it waits for the shop's check instead of joining."""
        async with siteverify() as (url, provider):
            client, origin = await gateway(
                start_gateway, bot_check_url=url, bot_check_secret=provider.secret
            )
            room = {"admit_per_s": 5, "token_ttl_s": 60, "bot_check": True}
            resp = await client.put(
                f"/admin/skus/{sku}", json={"stock": 2, "waiting_room": room}, headers=ADMIN_HEADERS
            )
            assert resp.status == 200, await resp.text()
            unchecked = await buyers(origin)
            await unchecked.open(f"/wait/{sku}?user_id=nobody")
            await unchecked.reach("bot_check")
            assert_clean(unchecked, answered=(403,))
            buyer = await buyers(origin)
            await buyer.open(f"/wait/{sku}?user_id=buyer&bot_token=pass-buyer")
            await buyer.reach("admitted")
            assert [form["response"] for form in provider.asked] == ["pass-buyer"]
            assert "bot_token" not in buyer.page.url
            assert_clean(buyer)
