"""The bot check at a waiting room's door, against a siteverify of the suite's
own on loopback (testkit.siteverify) and real Redis and PostgreSQL: success,
failure, a reused token, a timeout and a 500."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.domain.errors import BotCheckUnavailable
from gateway.outbound.bot_check import SiteVerify
from gateway.redis.layout import RoomKeys
from gateway.settings import Settings, load
from gateway.usecases.admission_tokens import CHECKED
from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS
from testkit.rooms import SECRET, admitted_token, buy_with, join
from testkit.siteverify import SiteVerify as Provider
from testkit.siteverify import siteverify

ROOM = {"admit_per_s": 100, "token_ttl_s": 60, "bot_check": True}


def settings_for(url: str, secret: str) -> Settings:
    return load({"GATEWAY_BOT_CHECK_URL": url, "GATEWAY_BOT_CHECK_SECRET": secret})


async def join_with(client: Any, sku: str, user: str, token: str | None) -> tuple[int, Any]:
    """``POST /v1/queue/{sku}`` with a bot token (when given); (status, body)."""
    body = {"user_id": user} if token is None else {"user_id": user, "bot_token": token}
    resp = await client.post(f"/v1/queue/{sku}", json=body)
    return resp.status, await resp.json()


class TestSiteVerify:
    """The adapter speaks the documented protocol: one form-encoded POST."""

    async def test_success_and_failure(self) -> None:
        """``{"success": true}`` passes; a refusal does not; the form carries
        secret, response and remoteip."""
        async with siteverify() as (url, provider):
            check = SiteVerify(settings_for(url, provider.secret))
            try:
                assert await check.passes("pass-1", "203.0.113.7") is True
                assert await check.passes("fail-1", None) is False
            finally:
                await check.close()
        assert provider.asked == [
            {"secret": provider.secret, "response": "pass-1", "remoteip": "203.0.113.7"},
            {"secret": provider.secret, "response": "fail-1"},
        ]

    async def test_the_provider_refuses_a_token_twice(self) -> None:
        """A token verified once is refused after (timeout-or-duplicate)."""
        async with siteverify() as (url, provider):
            check = SiteVerify(settings_for(url, provider.secret))
            try:
                assert await check.passes("pass-1", None) is True
                assert await check.passes("pass-1", None) is False
            finally:
                await check.close()

    @pytest.mark.parametrize(
        ("token", "secret", "detail"),
        [
            ("boom-1", None, "the provider answered 500"),
            ("hang-1", None, "no answer within 0.2s"),
            ("pass-1", "not-our-secret", "invalid-input-secret"),
        ],
    )
    async def test_unavailable(self, token: str, secret: str | None, detail: str) -> None:
        """A 500, no answer in time, or a refusal of our secret: unavailable."""
        async with siteverify() as (url, provider):
            check = SiteVerify(settings_for(url, secret or provider.secret), timeout_s=0.2)
            try:
                with pytest.raises(BotCheckUnavailable, match=detail):
                    await check.passes(token, None)
            finally:
                await check.close()


class TestDoor:
    """A room with bot_check, served by a gateway."""

    async def test_refused_where_it_cannot_work(self, start_gateway: Any, sku: str) -> None:
        """An instance without the settings answers a PUT of such a room 422
        not_configured, and stores nothing."""
        client = await start_gateway(admission_secret=SECRET)
        body = {"stock": 1, "waiting_room": ROOM}
        resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
        answer = await resp.json()
        assert (resp.status, answer["error"]) == (422, "not_configured")
        assert "GATEWAY_BOT_CHECK_URL" in answer["detail"]
        resp = await client.post(f"/v1/queue/{sku}", json={"user_id": "u"})
        assert resp.status == 404

    async def test_a_checked_join_buys(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """No token: 403. A token that passes: a checked ticket, whose token buys;
        the spent bot token is kept 300 s; the buyer joins again without one."""
        async with siteverify() as (url, provider):
            client = await start_gateway(
                admission_secret=SECRET, bot_check_url=url, bot_check_secret=provider.secret
            )
            resp = await client.put(
                f"/admin/skus/{sku}", json={"stock": 2, "waiting_room": ROOM}, headers=ADMIN_HEADERS
            )
            assert (await resp.json())["waiting_room"]["bot_check"] is True
            assert await join_with(client, sku, "alice", None) == (
                403,
                {"error": "bot_check_failed", "detail": "this waiting room needs a bot_token"},
            )
            status, joined = await join_with(client, sku, "alice", "pass-alice")
            assert status == 200 and joined["ticket"].startswith(CHECKED)
            assert provider.asked[-1]["remoteip"] == "127.0.0.1"
            keys = await redis.keys(RoomKeys.of(key_prefix, sku).bot("*"))
            assert len(keys) == 1 and 0 < await redis.pttl(keys[0]) <= 300_000
            assert (await join(client, sku, "alice"))[1]["ticket"] == joined["ticket"]
            token = await admitted_token(client, sku, joined["ticket"])
            assert (await buy_with(client, sku, "alice", token, "r1"))[0] == 201

    async def test_refused_and_reused(self, start_gateway: Any, sku: str) -> None:
        """The provider's refusal is 403; a token that made a ticket is 403 for
        anyone else, even from a provider that would take it again."""
        async with siteverify(Provider(duplicates=True)) as (url, provider):
            client = await start_gateway(
                admission_secret=SECRET, bot_check_url=url, bot_check_secret=provider.secret
            )
            body = {"stock": 2, "waiting_room": ROOM}
            await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
            status, refused = await join_with(client, sku, "alice", "fail-alice")
            assert (status, refused["error"]) == (403, "bot_check_failed")
            assert (await join_with(client, sku, "alice", "pass-1"))[0] == 200
            status, reused = await join_with(client, sku, "bob", "pass-1")
            assert (status, reused["detail"]) == (403, "this bot_token was already used")
            assert len(provider.asked) == 3

    @pytest.mark.parametrize("token", ["boom-1", "hang-1"])
    async def test_the_provider_down_fails_closed(
        self, start_gateway: Any, sku: str, token: str
    ) -> None:
        """A 500 or no answer within 2 s: 503 bot_check_unavailable with
        Retry-After, and nobody in line."""
        async with siteverify() as (url, provider):
            client = await start_gateway(
                admission_secret=SECRET, bot_check_url=url, bot_check_secret=provider.secret
            )
            body = {"stock": 2, "waiting_room": ROOM}
            await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
            resp = await client.post(f"/v1/queue/{sku}", json={"user_id": "a", "bot_token": token})
            assert (resp.status, (await resp.json())["error"]) == (503, "bot_check_unavailable")
            assert resp.headers["Retry-After"] == "1"
            assert (await join_with(client, sku, "a", None))[0] == 403

    async def test_switched_on_in_the_middle_of_a_line(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """A ticket made before the check: its token does not buy (403
        admission_invalid); a join with a bot token gives a checked ticket in
        its place."""
        async with siteverify() as (url, provider):
            client = await start_gateway(
                admission_secret=SECRET, bot_check_url=url, bot_check_secret=provider.secret
            )
            room = {**ROOM, "bot_check": False, "admit_per_s": 1}
            await client.put(
                f"/admin/skus/{sku}", json={"stock": 5, "waiting_room": room}, headers=ADMIN_HEADERS
            )
            first = (await join(client, sku, "u1"))[1]["ticket"]
            old = (await join(client, sku, "u2"))[1]
            behind = (await join(client, sku, "u3"))[1]
            token = await admitted_token(client, sku, first)
            patch = {"waiting_room": {**room, "bot_check": True}}
            await client.patch(f"/admin/skus/{sku}", json=patch, headers=ADMIN_HEADERS)

            async def refused() -> bool:
                status, body = await buy_with(client, sku, "u1", token, "r1")
                return status == 403 and body["detail"] == "admission token unchecked"

            await wait_for(refused, within=10, what="the unchecked token refused")
            assert (await join_with(client, sku, "u2", None))[0] == 403
            status, checked = await join_with(client, sku, "u2", "pass-u2")
            assert status == 200 and checked["ticket"].startswith(CHECKED)
            line = await redis.zrange(RoomKeys.of(key_prefix, sku).wait, 0, -1)
            waiting = [str(t, "utf-8") for t in line if isinstance(t, bytes)]
            assert waiting == [checked["ticket"], behind["ticket"]]
            resp = await client.get(f"/v1/queue/{sku}/{old['ticket']}")
            assert resp.status == 404
