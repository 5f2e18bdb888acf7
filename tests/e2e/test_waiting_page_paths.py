"""The waiting-room page off its happy path, in a real browser (Debian's
chromium, via Playwright), against a real gateway on the shared Redis and
PostgreSQL: an admission that expires before any click, other tabs of a buyer
who already bought, a sale a month off refused at Buy, the progress bar in dark
mode, 429s ridden out and a window not yet open on a sku without a room
(docs/waiting-rooms.md).

Each wait is bounded and on a condition (``data-state``, an enabled button).
"""

from __future__ import annotations

import asyncio
import base64
import time
from datetime import UTC, datetime, timedelta

import pytest
from playwright.async_api import Route

from testkit.browser import TEXTS, Buyer, StartGateway, assert_clean, gateway
from testkit.purchases import orders_of, put_sku
from testkit.rooms import join, put_room_sku
from tests.e2e.conftest import OpenBuyer

# The first browser test's set-up may install chromium with apt-get (minutes on
# a fresh machine); each test's own waits are bounded by STATE_WITHIN_S.
pytestmark = pytest.mark.timeout(600)


class TestExpiry:
    """An admission token that expires unspent."""

    async def test_expired_turn_is_said_and_a_button_joins_again(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """With a 3 s token, an admitted buyer who does not click sees, at the
        token's expiry and before any click, that the turn ended: no Buy button,
        a Join the line again button. It joins again, is let in again, and buys."""
        client, origin = await gateway(start_gateway)
        await put_room_sku(client, sku, stock=5, token_ttl_s=3)
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=kim")
        await buyer.reach("admitted", audit=False)  # for 3 s
        assert await buyer.page.is_enabled("button#buy")
        await buyer.reach("turn_ended", within=10)
        assert await buyer.page.is_hidden("button#buy")
        assert await buyer.text("#wr-status") == TEXTS["turn_ended"]
        assert await buyer.text("button#retry") == TEXTS["join_again"]
        assert not any(u.endswith("/v1/purchase") for u in buyer.requests)
        await buyer.page.click("button#retry", timeout=10_000)  # waits until enabled
        await buyer.reach("admitted")
        await buyer.page.click("button#buy")
        await buyer.reach("confirmed")
        assert await orders_of(database_url, sku) == 1
        assert_clean(buyer)


class TestAnotherTab:
    """A buyer with several tabs on one sku, who bought from one of them."""

    async def test_other_tabs_show_the_order_whatever_their_token_was_told(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """Two tabs of ``yan`` admitted; tab 2 clicks Buy while tab 1's purchase
        is under way and is told 403 (``admission token used``): once tab 1's
        order is confirmed, tab 2 shows that order (``confirmed``, its id), not
        an error; a third tab opened afterwards shows it too, without buying. One
        order in PostgreSQL."""
        client, origin = await gateway(start_gateway)
        await put_room_sku(client, sku, stock=5)
        first = await buyers(origin)
        second = Buyer(await first.page.context.new_page(), origin)
        decided, refused = asyncio.Event(), asyncio.Event()

        async def held_answer(route: Route) -> None:
            # Tab 1's purchase is decided at once, its answer kept until tab 2 is refused.
            response = await route.fetch()
            decided.set()
            await asyncio.wait_for(refused.wait(), timeout=15)
            await route.fulfill(response=response)

        async def watch_refusal(route: Route) -> None:
            response = await route.fetch()
            if response.status == 403:
                refused.set()
            await route.fulfill(response=response)

        await first.page.route("**/v1/purchase", held_answer)
        await second.page.route("**/v1/purchase", watch_refusal)
        for tab in (first, second):
            await tab.open(f"/wait/{sku}?user_id=yan")
            await tab.reach("admitted")
        await first.page.click("button#buy")
        await asyncio.wait_for(decided.wait(), timeout=15)
        await second.page.click("button#buy")
        await first.reach("confirmed")
        order_id = await first.attr("order-id")
        await second.reach("confirmed")
        assert refused.is_set()
        assert await second.attr("order-id") == order_id
        assert order_id and order_id in await second.text("#wr-eta")
        third = Buyer(await first.page.context.new_page(), origin)
        await third.open(f"/wait/{sku}?user_id=yan")
        await third.reach("confirmed")
        assert await third.attr("order-id") == order_id
        for tab in (first, second, third):
            assert sum(u.endswith("/v1/purchase") for u in tab.requests) == (tab is not third)
        assert await orders_of(database_url, sku) == 1
        assert_clean(first)
        assert_clean(second, answered=(403,))
        assert_clean(third)


class TestFarOffSale:
    """A sale that opens weeks ahead, longer than a browser timer reaches."""

    async def test_buy_refused_not_started_counts_down_in_days_and_waits(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str
    ) -> None:
        """A sku without a room opening in 30 days, whose start the page did not
        know (its sku lookup answered without ``starts_at``), offers Buy; the
        click is refused 409 ``not_started`` (its Retry-After made 1 s): the
        page counts down in days ("29 d ..."), ticking, and keeps counting down
        to the start (no Buy button comes back, nothing is bought again) rather
        than offering Buy after Retry-After."""
        client, origin = await gateway(start_gateway)
        starts = datetime.now(UTC) + timedelta(days=30)
        await put_sku(client, sku, 5, starts_at=starts.isoformat())
        buyer = await buyers(origin)

        async def without_start(route: Route) -> None:
            response = await route.fetch()
            info = await response.json()
            info.pop("starts_at", None)
            await route.fulfill(response=response, json=info)

        async def soon_again(route: Route) -> None:
            # Were Retry-After the page's cue, Buy would come back within 1.5 s.
            response = await route.fetch()
            headers = {**response.headers, "retry-after": "1"}
            await route.fulfill(response=response, headers=headers)

        await buyer.page.route(f"**/v1/skus/{sku}", without_start)
        await buyer.page.route("**/v1/purchase", soon_again)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("admitted")
        await buyer.page.click("button#buy")
        await buyer.reach("not_started")
        shown = datetime.fromisoformat(str(await buyer.attr("starts-at")).replace("Z", "+00:00"))
        assert abs((shown - starts).total_seconds()) < 1
        await buyer.ticks("#wr-eta", 3)
        assert (await buyer.text("#wr-eta")).startswith(TEXTS["countdown"].split("{")[0] + "29 d")
        assert await buyer.attr("state") == "not_started"
        assert await buyer.page.is_hidden("button#buy")
        assert sum(u.endswith("/v1/purchase") for u in buyer.requests) == 1
        assert_clean(buyer, answered=(409,))


def luminance(rgb: tuple[int, int, int]) -> float:
    """WCAG 2.1's relative luminance of an sRGB colour."""
    linear = [c / 255 / 12.92 if c <= 10 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


async def middle_colour(buyer: Buyer, png: bytes) -> tuple[int, int, int]:
    """The colour at the centre of a screenshot, read by a canvas in a blank
    context of the same browser (so the buyer's page asks for nothing)."""
    browser = buyer.page.context.browser
    assert browser is not None
    scratch = await browser.new_context()
    try:
        page = await scratch.new_page()
        rgb = await page.evaluate(
            """async (src) => {
              const img = new Image();
              img.src = src;
              await img.decode();
              const canvas = document.createElement("canvas");
              [canvas.width, canvas.height] = [img.width, img.height];
              const g = canvas.getContext("2d");
              g.drawImage(img, 0, 0);
              const x = Math.floor(img.width / 2), y = Math.floor(img.height / 2);
              return Array.from(g.getImageData(x, y, 1, 1).data.slice(0, 3));
            }""",
            "data:image/png;base64," + base64.b64encode(png).decode(),
        )
    finally:
        await scratch.close()
    return (rgb[0], rgb[1], rgb[2])


class TestDarkMode:
    """The page under ``prefers-color-scheme: dark``."""

    async def test_empty_progress_bar_reads_as_empty_in_dark_mode(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str
    ) -> None:
        """In dark mode, a buyer just in line sees an empty bar whose track is
        dark (relative luminance under 0.1): darker than the bar's fill, and told apart from
        it at WCAG's 3:1 for graphics (compared on screenshots of the bar,
        empty as shown and then filled)."""
        client, origin = await gateway(start_gateway)
        await put_room_sku(client, sku, stock=10, admit_per_s=1)
        for i in range(5):
            assert (await join(client, sku, f"ahead{i}"))[0] == 200
        buyer = await buyers(origin)
        await buyer.page.emulate_media(color_scheme="dark")
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("waiting")
        bar = buyer.page.locator("progress#wr-progress")
        assert await bar.evaluate("(bar) => bar.value") == 0
        empty = await middle_colour(buyer, await bar.screenshot(animations="disabled"))
        await bar.evaluate("(bar) => (bar.value = 100)")
        # The fill grows in a CSS transition: its centre is read once reached (bounded).
        for _ in range(50):
            full = await middle_colour(buyer, await bar.screenshot(animations="disabled"))
            if full != empty:
                break
        lum_empty, lum_full = luminance(empty), luminance(full)
        assert lum_empty < lum_full, (empty, full)
        assert (lum_full + 0.05) / (lum_empty + 0.05) >= 3, (empty, full)
        assert lum_empty < 0.1, empty
        assert_clean(buyer)


class TestWithoutRoom:
    """A sku without a waiting room: a 429 ridden out, a window not yet open."""

    async def test_429s_are_backed_off_and_said_then_the_buyer_buys(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """The sku lookup answered 429 twice (``Retry-After: 1``, then none): the
        page says the shop is busy and when it tries again, asks again no sooner
        than 1 s, then 2 s later (its doubling step), then is let in and buys."""
        client, origin = await gateway(start_gateway)
        await put_sku(client, sku, 3)
        buyer = await buyers(origin)
        asked: list[float] = []

        async def busy(route: Route) -> None:
            asked.append(time.monotonic())
            if len(asked) > 2:
                await route.continue_()
                return
            headers = {"Retry-After": "1"} if len(asked) == 1 else {}
            body = {"error": "rate_limited", "detail": "slow down"}
            await route.fulfill(status=429, headers=headers, json=body)

        await buyer.page.route(f"**/v1/skus/{sku}", busy)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        busy_prefix = TEXTS["busy"].split("{")[0]
        await buyer.page.wait_for_function(
            "(said) => document.getElementById('wr-note').textContent.startsWith(said)",
            arg=busy_prefix,
            timeout=5_000,
        )
        await buyer.reach("admitted")
        assert await buyer.text("#wr-note") == ""
        assert len(asked) == 3
        assert asked[1] - asked[0] >= 1 - 0.05 and asked[2] - asked[1] >= 2 - 0.05, asked
        await buyer.page.click("button#buy")
        await buyer.reach("confirmed")
        assert await orders_of(database_url, sku) == 1
        assert_clean(buyer, answered=(429, 429))

    async def test_window_opening_soon_counts_down_then_buys(
        self, start_gateway: StartGateway, buyers: OpenBuyer, sku: str, database_url: str
    ) -> None:
        """A sku without a room opening in 3 s: ``not_started`` with its start and
        a countdown, no Buy button and no purchase before the start; then Buy,
        which buys."""
        client, origin = await gateway(start_gateway)
        starts = datetime.now(UTC) + timedelta(seconds=3)
        await put_sku(client, sku, 5, starts_at=starts.isoformat())
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{sku}?user_id=buyer")
        await buyer.reach("not_started", audit=False)  # for 3 s
        shown = datetime.fromisoformat(str(await buyer.attr("starts-at")).replace("Z", "+00:00"))
        assert abs((shown - starts).total_seconds()) < 0.01
        assert (await buyer.text("#wr-eta")).startswith(TEXTS["countdown"].split("{")[0])
        assert await buyer.page.is_hidden("button#buy")
        await buyer.reach("admitted", within=15)
        assert datetime.now(UTC) >= starts
        assert not any(u.endswith("/v1/purchase") for u in buyer.requests)
        await buyer.page.click("button#buy")
        await buyer.reach("confirmed")
        assert await orders_of(database_url, sku) == 1
        assert not any("/v1/queue/" in u for u in buyer.requests)
        assert_clean(buyer)
