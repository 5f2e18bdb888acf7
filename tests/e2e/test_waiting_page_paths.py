"""The waiting-room page off its happy path, in a real browser (Debian's
chromium, via Playwright), against a real gateway on the shared Redis and
PostgreSQL: an admission that expires before any click, a second tab of a buyer
who already bought (docs/waiting-page.md).

Each wait is bounded and on a condition (``data-state``, an enabled button).
"""

from __future__ import annotations

import pytest

from testkit.browser import TEXTS, StartGateway, assert_clean, gateway
from testkit.purchases import orders_of
from testkit.rooms import put_room_sku
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
        await buyer.reach("admitted")
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
