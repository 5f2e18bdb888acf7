"""The waiting-room page after the 201 of a sku with a payment window, in a real
browser (Debian's chromium, via Playwright), against a real gateway on the
shared Redis and PostgreSQL: the deadline, its countdown and the shop's pay
link; then paid, cancelled or expired, and another try (docs/waiting-rooms.md).

Windows of a few seconds and a sweep every 50 ms let an order expire within
a test; every wait is bounded and on a condition (``data-state``, an element).
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from testkit.browser import TEXTS, Buyer, StartGateway, assert_clean, gateway
from testkit.purchases import Client, buy, look_up, orders_of, put_sku
from tests.e2e.conftest import PHONE, OpenBuyer

# The first browser test's set-up may install chromium with apt-get (minutes on
# a fresh machine); each test's own waits are bounded by STATE_WITHIN_S.
pytestmark = pytest.mark.timeout(600)

# WAITING_PAGE_SHOTS=docs saves the pending and expired views there
# (docs/waiting-rooms.md's pictures of them).
SHOTS_DIR = os.environ.get("WAITING_PAGE_SHOTS")
PAYMENT_TOKEN = "test-payment-token"
PAY_HEADERS = {"Authorization": f"Bearer {PAYMENT_TOKEN}"}
# A shop's payment page: only linked to, never loaded, so no request leaves the gateway.
SHOP = "https://shop.example"


async def order_of(client: Client, rid: str, user: str) -> dict[str, Any]:
    """``GET /v1/orders/{request_id}?user_id=``'s order, as its buyer (asserts a 200)."""
    status, body = await look_up(client, rid, user)
    assert status == 200, body
    return body


async def bought(buyer: Buyer, sku: str, audit: bool = True) -> str:
    """Click Buy on an admitted page; the request id the page bought under
    (``audit``: whether the order's view is audited)."""
    await buyer.reach("admitted")
    await buyer.page.click("button#buy")
    await buyer.reach("confirmed", audit=audit)
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
        await put_sku(client, sku, 1, payment_window_s=5)
        buyer = await buyers(origin, viewport=PHONE)
        await buyer.open(f"/wait/{sku}?user_id=buyer&pay_to={SHOP}/pay")
        rid = await bought(buyer, sku, audit=False)  # for 5 s
        assert await buyer.attr("order-status") == "pending_payment"
        assert await buyer.text("#wr-status") == TEXTS["pending"]
        order = await order_of(client, rid, "buyer")
        pay_by = datetime.fromisoformat(order["pay_by"])
        shown = datetime.fromisoformat(str(await buyer.attr("pay-by")).replace("Z", "+00:00"))
        assert abs((shown - pay_by).total_seconds()) < 0.001
        assert await buyer.page.get_attribute("a#pay", "href") == f"{SHOP}/pay?request_id={rid}"
        assert await buyer.page.is_visible("a#pay")
        first = await buyer.text("#wr-deadline")
        assert first.endswith(" s left.")
        await buyer.ticks("#wr-deadline", 1)
        await buyer.snap("pay")
        await buyer.reach("expired")
        assert await buyer.attr("order-status") == "expired"
        assert await buyer.text("#wr-status") == TEXTS["expired"]
        assert await buyer.page.is_hidden("a#pay")
        assert (await order_of(client, rid, "buyer"))["status"] == "expired"
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
        await put_sku(client, sku, 3, payment_window_s=600)
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
            headers=PAY_HEADERS,
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
        await put_sku(client, sku, 2, payment_window_s=600)
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        rid = await bought(buyer, sku)
        resp = await client.post(f"/v1/orders/{rid}/cancel", headers=PAY_HEADERS)
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
        await put_sku(client, sku, 1, payment_window_s=3)
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("admitted")
        assert (await buy(client, sku, "other"))[1]["status"] == "pending_payment"
        await buyer.page.click("button#buy")
        await buyer.reach("sold_out", audit=False)  # for 3 s
        assert await buyer.attr("held") == "1"
        assert await buyer.text("#wr-status") == TEXTS["sold_out_held"].replace("{held}", "1")
        assert await buyer.page.is_disabled("button#retry")
        await buyer.page.click("button#retry", timeout=10_000)  # waits until enabled
        rid = await bought(buyer, sku)
        assert (await order_of(client, rid, "buyer"))["user_id"] == "buyer"
        assert await orders_of(database_url, sku) == 2
        assert_clean(buyer, answered=(409,))

    async def test_expired_order_in_a_room_joins_the_line_again(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """A sku with a waiting room: an order not paid in time is said expired.
        Try again joins the line again at once (the expiry ended the buyer's
        turn: a new ticket at the back, not the spent one) and buys the unit
        that came back, with no refusal on the way."""
        client, origin = await gateway(
            start_gateway, payment_token=PAYMENT_TOKEN, expiry_sweep_s=0.05
        )
        # The turn's token (8 s) outlasts the window (2 s): Try again comes while
        # it is still live, so only the ended turn lets the buyer in again.
        await put_sku(
            client, sku, 1, payment_window_s=2, waiting_room={"admit_per_s": 100, "token_ttl_s": 8}
        )
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        rid = await bought(buyer, sku)
        await buyer.reach("expired")
        await buyer.page.click("button#retry", timeout=10_000)
        again = await bought(buyer, sku)
        assert again != rid
        assert (await order_of(client, again, "buyer"))["status"] == "pending_payment"
        assert await orders_of(database_url, sku) == 2
        assert_clean(buyer)
