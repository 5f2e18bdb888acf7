"""What the waiting-room page says is sold (issue 34), in a real browser (Debian's
chromium, via Playwright) against a real gateway: a sku's display fields shown
as text, never as markup; its image loaded from a listed origin alone (the
page's policy blocks any other); a sku without them named as before
(docs/waiting-rooms.md).

The images come from small servers on loopback ports of their own, so each is
another origin than the gateway's, and each counts what it was asked for.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from testkit.browser import TEXTS, Buyer, StartGateway, assert_clean, gateway
from testkit.purchases import ADMIN_HEADERS, Client, put_sku
from tests.e2e.conftest import OpenBuyer

pytestmark = pytest.mark.timeout(600)

# A 1x1 PNG: enough for a decoded image (naturalWidth 1).
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
HOSTILE = "<img src=x onerror=alert(1)>Desk"
# The image box keeps a 4:3 place before the image arrives: nothing below it moves.
IMAGE_BOX = "el => { const r = el.getBoundingClientRect(); return [r.width, r.height]; }"


@dataclass
class ImageServer:
    """An image origin on a loopback port; ``hits`` are the paths it served."""

    origin: str = ""
    hits: list[str] = field(default_factory=list)


@pytest.fixture
async def image_servers() -> AsyncIterator[Callable[[], Awaitable[ImageServer]]]:
    """A factory of image servers, each on a port of its own, closed after the test."""
    servers: list[TestServer] = []

    async def start() -> ImageServer:
        found = ImageServer()

        async def image(request: web.Request) -> web.Response:
            found.hits.append(request.path)
            return web.Response(body=PNG, content_type="image/png")

        app = web.Application()
        app.router.add_get("/{name}", image)
        server = TestServer(app, host="127.0.0.1")
        servers.append(server)
        await server.start_server()
        found.origin = str(server.make_url("")).rstrip("/")
        return found

    try:
        yield start
    finally:
        for server in servers:
            await server.close()


async def put_display(client: Client, sku: str, **display: str) -> None:
    """Create ``sku`` (3 units, no room) with display fields (asserts a 200)."""
    resp = await client.put(
        f"/admin/skus/{sku}", json={"stock": 3, **display}, headers=ADMIN_HEADERS
    )
    assert resp.status == 200, await resp.text()


class TestDisplayFields:
    """The operator's title, image and price on the page."""

    async def test_title_and_price_are_text_and_the_listed_image_loads(
        self,
        start_gateway: StartGateway,
        buyers: OpenBuyer,
        sku: str,
        image_servers: Callable[[], Awaitable[ImageServer]],
    ) -> None:
        """A title that reads as markup is the heading and the document's title
        letter for letter: no element is made of it, no dialog opens. The
        price is shown; the image, on another loopback port listed in
        GATEWAY_WAITING_PAGE_IMAGE_ORIGINS, loads (naturalWidth > 0) in a box
        4:3 wide that was there before it, with the title as its alt. After a
        purchase and a reload (the order looked up, not the sale) the page
        still shows them. That image is the page's only request off the
        gateway's origin."""
        listed = await image_servers()
        client, origin = await gateway(
            start_gateway, waiting_page_image_origins=frozenset({listed.origin})
        )
        image_url = f"{listed.origin}/desk.png"
        await put_display(client, sku, title=HOSTILE, price_text="¥99", image_url=image_url)
        buyer = await buyers(origin)
        dialogs: list[str] = []
        buyer.page.on("dialog", lambda d: dialogs.append(d.message))
        await buyer.open(f"/wait/{sku}?user_id=ann")
        await buyer.reach("admitted")
        await buyer.page.wait_for_function(
            "() => document.getElementById('wr-image').naturalWidth > 0", timeout=10_000
        )
        assert await buyer.text("h1#wr-title") == HOSTILE
        assert await buyer.page.title() == HOSTILE
        assert await buyer.text("#wr-price") == "¥99"
        assert await buyer.page.get_attribute("#wr-image", "alt") == HOSTILE
        assert await buyer.page.locator("img").count() == 1
        width, height = await buyer.page.eval_on_selector("#wr-image", IMAGE_BOX)
        assert width > 0 and abs(height - width * 3 / 4) < 1
        # Bought, then reloaded: the order is looked up, and the sku still named so.
        await buyer.page.click("button#buy")
        await buyer.reach("confirmed")
        await buyer.page.reload()
        await buyer.reach("confirmed")
        await buyer.page.wait_for_function(
            "(said) => document.getElementById('wr-title').textContent === said",
            arg=HOSTILE,
            timeout=10_000,
        )
        assert await buyer.text("#wr-price") == "¥99"
        assert dialogs == []
        assert set(listed.hits) == {"/desk.png"}
        assert set(buyer.foreign_requests()) == {image_url}
        buyer.requests[:] = [u for u in buyer.requests if u != image_url]
        assert_clean(buyer)

    async def test_unlisted_image_is_blocked_and_a_bare_sku_is_named(
        self,
        start_gateway: StartGateway,
        buyers: OpenBuyer,
        sku: str,
        image_servers: Callable[[], Awaitable[ImageServer]],
        database_url: str,
    ) -> None:
        """A stored image_url off the listed origins (written in the database, as
        a row left from before the operator dropped its origin would be) is
        never fetched: the page's policy blocks it, and the image is hidden,
        not shown broken. A sku without display fields is named by its sku,
        with no product block, and asks for nothing off the gateway's origin."""
        listed, unlisted = await image_servers(), await image_servers()
        client, origin = await gateway(
            start_gateway, waiting_page_image_origins=frozenset({listed.origin})
        )
        stale = f"{sku}-stale"
        await put_display(client, stale, title="Desk", image_url=f"{listed.origin}/desk.png")
        # Nothing has read the sku since the PUT, so no catalog holds the old row.
        con = await asyncpg.connect(database_url)
        try:
            await con.execute(
                "UPDATE sku_display SET image_url = $2 WHERE sku = $1",
                stale,
                f"{unlisted.origin}/desk.png",
            )
        finally:
            await con.close()
        await put_sku(client, sku, 3)
        buyer = await buyers(origin)
        await buyer.open(f"/wait/{stale}?user_id=bo")
        await buyer.reach("admitted")
        # Given its source, then hidden again: its error came (the policy's refusal).
        await buyer.page.wait_for_function(
            "(el) => el.getAttribute('src') && el.hidden",
            arg=await buyer.page.query_selector("#wr-image"),
            timeout=10_000,
        )
        assert await buyer.page.get_attribute("#wr-image", "src") == f"{unlisted.origin}/desk.png"
        assert await buyer.text("h1#wr-title") == "Desk"
        assert await buyer.page.eval_on_selector("#wr-image", "el => el.naturalWidth") == 0
        assert unlisted.hits == [] and listed.hits == []
        assert len(buyer.console_errors) == 1
        assert "Content Security Policy" in buyer.console_errors[0]
        bare = Buyer(await buyer.page.context.new_page(), origin)
        await bare.open(f"/wait/{sku}?user_id=bo")
        await bare.reach("admitted")
        assert await bare.text("h1#wr-title") == TEXTS["title"].replace("{sku}", sku)
        assert await bare.page.is_hidden("#wr-product")
        assert_clean(bare)
