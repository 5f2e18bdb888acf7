"""An admission token that expired unspent (issue 19): the buyer joins again, at
the back of the line; through an in-process gateway on real Redis and PostgreSQL."""

from __future__ import annotations

from typing import Any

from testkit.polling import wait_for
from testkit.rooms import SECRET, admitted_token, buy_with, join, put_room_sku


class TestExpiredAdmission:
    """An admission whose token expired unspent is not a dead end (issue 19)."""

    async def test_a_rejoin_after_expiry_goes_to_the_back_of_the_line(
        self, start_gateway: Any, sku: str
    ) -> None:
        """Alice is admitted with a 1 s token and lets it expire; Bob joined in the
        meantime. After the expiry a rejoin gives Alice a new ticket behind Bob,
        which is admitted in turn and buys with its new token, while the expired
        one stays refused."""
        client = await start_gateway(admission_secret=SECRET)
        await put_room_sku(client, sku, 5, admit_per_s=1, token_ttl_s=1)
        _, alice = await join(client, sku, "alice")
        old_token = await admitted_token(client, sku, alice["ticket"])
        _, bob = await join(client, sku, "bob")

        async def rejoined() -> dict[str, Any] | None:
            status, place = await join(client, sku, "alice")
            assert status == 200, place
            return place if place["ticket"] != alice["ticket"] else None

        again = await wait_for(rejoined, within=10, what="a new ticket after the expiry")
        assert again["position"] == 2  # Bob (still unpolled) is ahead
        assert (await buy_with(client, sku, "alice", old_token, "old"))[0] == 403
        await admitted_token(client, sku, bob["ticket"])
        new_token = await admitted_token(client, sku, again["ticket"])
        assert (await buy_with(client, sku, "alice", new_token, "new"))[0] == 201
