"""Waiting rooms on real Redis and PostgreSQL: joining, pace, tokens, sold out."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from redis.asyncio import Redis

from gateway.redis.layout import RoomKeys
from gateway.usecases.admission_tokens import Signer
from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS, client_metric, db_state
from testkit.rooms import (
    OLD_SECRET,
    SECRET,
    admitted_token,
    buy_with,
    join,
    poll,
    put_room_sku,
)
from testkit.schema import schema


def _link(path: str, name: str) -> dict[str, Any]:
    """A link of the 200 answer of ``GET {path}`` in docs/openapi.yaml."""
    link: dict[str, Any] = schema()["paths"][path]["get"]["responses"]["200"]["links"][name]
    return link


BUY_ADMITTED = _link("/v1/queue/{sku}/{ticket}", "BuyAdmitted")


def _follow(
    link: dict[str, Any], path: dict[str, str], answer: dict[str, Any]
) -> tuple[dict[str, str], dict[str, Any]]:
    """The headers and body a client following ``link`` sends, from the request's
    ``path`` parameters and the ``answer`` it follows (the two runtime expressions
    the schema's links use)."""

    def value(expression: str) -> Any:
        if expression.startswith("$request.path."):
            return path[expression.removeprefix("$request.path.")]
        return answer[expression.removeprefix("$response.body#/")]

    headers = {
        name.removeprefix("header."): value(e) for name, e in link.get("parameters", {}).items()
    }
    return headers, {name: value(e) for name, e in link.get("requestBody", {}).items()}


async def queue_line(redis: Redis, wait_key: str) -> list[str]:
    """The tickets waiting, head first, as Redis holds them."""
    return [str(t, "utf-8") for t in await redis.zrange(wait_key, 0, -1) if isinstance(t, bytes)]


class TestJoining:
    """Joining gives a ticket and a place in line; the admin API stores the room."""

    async def test_room_is_stored_and_shown(self, start_gateway: Any, sku: str) -> None:
        """PUT with a waiting room answers it back; a PUT without one removes it, and
        the sku is then bought without a token."""
        client = await start_gateway(admission_secret=SECRET)
        answer = await put_room_sku(client, sku, 3, admit_per_s=7, token_ttl_s=30)
        assert answer["waiting_room"] == {
            "admit_per_s": 7,
            "token_ttl_s": 30,
            "shuffle_at_start": False,
        }
        status, body = await buy_with(client, sku, "u1", None, "r1")
        assert (status, body) == (428, {"error": "admission_required", "detail": body["detail"]})
        resp = await client.put(f"/admin/skus/{sku}", json={"stock": 3}, headers=ADMIN_HEADERS)
        assert "waiting_room" not in await resp.json()
        assert (await buy_with(client, sku, "u1", None, "r2"))[0] == 201

    async def test_join_twice_returns_the_same_ticket(self, start_gateway: Any, sku: str) -> None:
        """A second join of the same user gets the first ticket and place; the next
        user queues behind."""
        client = await start_gateway(admission_secret=SECRET)
        await put_room_sku(client, sku, 5, admit_per_s=1)
        status, first = await join(client, sku, "alice")
        assert status == 200 and first["position"] == 1
        assert first["eta_s"] == 1 and first["poll_after_s"] >= 1
        _, again = await join(client, sku, "alice")
        assert again["ticket"] == first["ticket"]
        _, bob = await join(client, sku, "bob")
        assert bob["ticket"] != first["ticket"] and bob["position"] == 2

    async def test_bad_input_is_a_typed_4xx(self, start_gateway: Any, sku: str) -> None:
        """Unknown skus, skus without a room, unknown tickets and bad bodies are JSON 4xx."""
        client = await start_gateway(admission_secret=SECRET)
        resp = await client.post("/v1/queue/nope", json={"user_id": "u"})
        assert (resp.status, (await resp.json())["error"]) == (404, "unknown_sku")
        await client.put(f"/admin/skus/{sku}", json={"stock": 1}, headers=ADMIN_HEADERS)
        resp = await client.post(f"/v1/queue/{sku}", json={"user_id": "u"})
        assert (resp.status, (await resp.json())["error"]) == (404, "no_waiting_room")
        await put_room_sku(client, sku, 1)
        resp = await client.get(f"/v1/queue/{sku}/deadbeef")
        assert (resp.status, (await resp.json())["error"]) == (404, "unknown_ticket")
        for bad in ({}, {"user_id": 7}, {"user_id": "u", "x": 1}):
            resp = await client.post(f"/v1/queue/{sku}", json=bad)
            assert (resp.status, (await resp.json())["error"]) == (400, "invalid_request")
        room = {"stock": 1, "waiting_room": {"admit_per_s": 0, "token_ttl_s": 5}}
        resp = await client.put(f"/admin/skus/{sku}", json=room, headers=ADMIN_HEADERS)
        assert resp.status == 400


class TestPace:
    """At most admit_per_s people are let in per second, first come first served,
    across every instance."""

    async def test_fifo_and_at_most_admit_per_s_across_two_instances(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """Ten people join through one instance and poll through two; every one is
        let in, in join order, and no 1000 ms of Redis's clock sees more than 3."""
        first = await start_gateway(admission_secret=SECRET)
        second = await start_gateway(admission_secret=SECRET)
        await put_room_sku(first, sku, 10, admit_per_s=3)
        tickets = [(await join(first, sku, f"u{i}"))[1]["ticket"] for i in range(10)]

        async def everyone_in() -> bool:
            answers = [await poll((first, second)[i % 2], sku, t) for i, t in enumerate(tickets)]
            return all(a["status"] == "admitted" for a in answers)

        await wait_for(everyone_in, within=20, what="all ten admitted")
        records = await redis.hmget(RoomKeys.of(key_prefix, sku).tickets, tickets)
        admitted_ms = [int(str(r, "utf-8").split("|")[1]) for r in records if isinstance(r, bytes)]
        assert len(admitted_ms) == 10
        assert admitted_ms == sorted(admitted_ms), "let in out of join order"
        per_window = [sum(1 for t in admitted_ms if s <= t < s + 1000) for s in admitted_ms]
        assert max(per_window) == 3
        assert (
            await client_metric(first, "flashsale_waiting_room_admitted_total")
            + (await client_metric(second, "flashsale_waiting_room_admitted_total"))
            == 10
        )

    async def test_waiting_positions_move_up(self, start_gateway: Any, sku: str) -> None:
        """Once the head is let in, the next person's position is 1."""
        client = await start_gateway(admission_secret=SECRET)
        await put_room_sku(client, sku, 5, admit_per_s=1)
        _, a = await join(client, sku, "a")
        _, b = await join(client, sku, "b")
        await admitted_token(client, sku, a["ticket"])
        body = await poll(client, sku, b["ticket"])
        if body["status"] == "waiting":  # unless a second went by since
            assert body["position"] == 1 and body["eta_s"] == 1


class TestTokens:
    """A token buys once, for its user and sku, until it expires."""

    async def test_a_token_buys_once_and_replays_get_the_outcome(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """The admitted buyer gets 201; the same token on a new request id is 403;
        the same request id again gets the same order."""
        client = await start_gateway(admission_secret=SECRET)
        await put_room_sku(client, sku, 5)
        _, place = await join(client, sku, "alice")
        token = await admitted_token(client, sku, place["ticket"])
        status, order = await buy_with(client, sku, "alice", token, "r1")
        assert status == 201
        status, again = await buy_with(client, sku, "alice", token, "r2")
        assert (status, again["error"]) == (403, "admission_invalid")
        status, replay = await buy_with(client, sku, "alice", token, "r1")
        assert (status, replay["order_id"]) == (201, order["order_id"])
        assert (await db_state(database_url, sku))[1] == 1

    async def test_following_the_schemas_link_from_an_admitted_poll_buys(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """A client that builds the purchase from docs/openapi.yaml's BuyAdmitted
        link and the admitted poll alone (the poll names the user the token admits)
        buys: 201 for that user. The schema fuzzer's stateful phase buys this way."""
        client = await start_gateway(admission_secret=SECRET)
        await put_room_sku(client, sku, 5)
        _, place = await join(client, sku, "alice")
        await admitted_token(client, sku, place["ticket"])
        standing = await poll(client, sku, place["ticket"])
        assert standing["user_id"] == "alice", standing
        headers, body = _follow(BUY_ADMITTED, {"sku": sku}, standing)
        resp = await client.post("/v1/purchase", json=body, headers=headers)
        assert resp.status == 201, await resp.text()
        assert (await resp.json())["user_id"] == "alice"
        assert (await db_state(database_url, sku))[1] == 1

    async def test_forged_foreign_and_expired_tokens_are_refused(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """A token with a changed signature, one shown by another user or for another
        sku, one signed with another key and one past its expiry: 403 each, nothing
        bought, each refusal counted by reason."""
        client = await start_gateway(admission_secret=SECRET)
        await put_room_sku(client, sku, 5)
        other = f"{sku}-other"
        await put_room_sku(client, other, 5)
        _, place = await join(client, sku, "alice")
        token = await admitted_token(client, sku, place["ticket"])
        ticket, expires, signature = token.split(".")
        flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
        past = int(time.time() * 1000) - 1
        refused = [
            (sku, "alice", f"{ticket}.{expires}.{flipped}"),
            (sku, "alice", f"{ticket}.{int(expires) + 1}.{signature}"),
            (sku, "mallory", token),
            (other, "alice", token),
            (
                sku,
                "alice",
                Signer("some-other-secret-000").sign(sku, "alice", ticket, past + 10**6),
            ),
            (sku, "alice", "not a token"),
            (sku, "alice", Signer(SECRET).sign(sku, "alice", ticket, past)),
        ]
        for i, (where, user, bad) in enumerate(refused):
            status, body = await buy_with(client, where, user, bad, f"bad{i}")
            assert (status, body["error"]) == (403, "admission_invalid"), (i, body)
        assert (await db_state(database_url, sku))[1] == 0
        metrics = await (await client.get("/metrics")).text()
        assert 'flashsale_admissions_refused_total{reason="forged"} 6.0' in metrics
        assert 'flashsale_admissions_refused_total{reason="expired"} 1.0' in metrics
        assert (await buy_with(client, sku, "alice", token, "good"))[0] == 201

    async def test_a_refused_purchase_gives_the_token_back(
        self, start_gateway: Any, sku: str
    ) -> None:
        """A purchase refused with a 400 (qty over the limit) did not buy: the token
        buys on the retry with another request id."""
        client = await start_gateway(admission_secret=SECRET)
        await put_room_sku(client, sku, 5)
        _, place = await join(client, sku, "alice")
        token = await admitted_token(client, sku, place["ticket"])
        assert (await buy_with(client, sku, "alice", token, "r1", qty=2))[0] == 400
        assert (await buy_with(client, sku, "alice", token, "r2"))[0] == 201

    async def test_previous_secret_is_accepted_during_a_rotation(
        self, start_gateway: Any, sku: str
    ) -> None:
        """A token signed with the old secret buys on an instance that has it as
        GATEWAY_ADMISSION_SECRET_PREVIOUS, and not on one that dropped it."""
        old = await start_gateway(admission_secret=OLD_SECRET)
        rotating = await start_gateway(
            admission_secret=SECRET, admission_secret_previous=OLD_SECRET
        )
        rotated = await start_gateway(admission_secret=SECRET)
        await put_room_sku(old, sku, 5)
        tokens = {}
        for user in ("alice", "bob"):
            _, place = await join(old, sku, user)
            tokens[user] = await admitted_token(old, sku, place["ticket"])
        assert (await buy_with(rotated, sku, "bob", tokens["bob"], "b1"))[0] == 403
        assert (await buy_with(rotating, sku, "alice", tokens["alice"], "a1"))[0] == 201

    async def test_without_a_secret_the_room_is_unavailable(
        self, start_gateway: Any, sku: str
    ) -> None:
        """An instance without GATEWAY_ADMISSION_SECRET answers 503 for a room's sku
        put through another instance, never lets anyone buy without a token."""
        await put_room_sku(await start_gateway(admission_secret=SECRET), sku, 5)
        client = await start_gateway()
        resp = await client.post(f"/v1/queue/{sku}", json={"user_id": "u"})
        assert (resp.status, (await resp.json())["error"]) == (503, "unavailable")
        assert (await buy_with(client, sku, "u", "t.1.x", "r1"))[0] == 503
        assert (await buy_with(client, sku, "u", None, "r2"))[0] == 428


class TestSoldOut:
    """Nobody waits for a sku that is gone."""

    async def test_waiting_and_joining_people_are_told_sold_out(
        self, start_gateway: Any, sku: str
    ) -> None:
        """Once the last unit is bought and settled, a waiting ticket polls sold_out
        and a new join gets 409 sold_out."""
        client = await start_gateway(admission_secret=SECRET)
        await put_room_sku(client, sku, 1, admit_per_s=1)
        _, first = await join(client, sku, "first")
        _, second = await join(client, sku, "second")
        token = await admitted_token(client, sku, first["ticket"])
        assert (await buy_with(client, sku, "first", token, "r1"))[0] == 201

        async def told() -> bool:
            return bool((await poll(client, sku, second["ticket"]))["status"] == "sold_out")

        await wait_for(told, what="waiting ticket told sold out")
        status, body = await join(client, sku, "late")
        assert (status, body) == (409, {"status": "sold_out"})
        # Without a token as well: sold out, not "admission required" (issue 19).
        assert await buy_with(client, sku, "late", None, "r2") == (409, {"status": "sold_out"})


class TestStart:
    """Before starts_at nobody is let in; with shuffle_at_start the early arrivals
    are dealt a random order once, at the start, ahead of later arrivals."""

    async def test_early_arrivals_are_shuffled_once_at_the_start(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """Thirty people join before the start: polls admit nobody; after it one
        person is let in, and the other 29 wait in an order that is not their join
        order; someone joining after the start is last, and a later poll does not
        shuffle again."""
        client = await start_gateway(admission_secret=SECRET)
        starts_at = datetime.now(UTC) + timedelta(seconds=2)
        body = {
            "stock": 50,
            "starts_at": starts_at.isoformat(),
            "waiting_room": {"admit_per_s": 1, "token_ttl_s": 60, "shuffle_at_start": True},
        }
        resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
        assert resp.status == 200 and (await resp.json())["starts_at"].endswith("Z")
        tickets = [(await join(client, sku, f"early{i}"))[1]["ticket"] for i in range(30)]
        before = await poll(client, sku, tickets[0])
        assert before["status"] == "waiting" and before["eta_s"] >= 2
        wait_key = RoomKeys.of(key_prefix, sku).wait

        async def someone_in() -> bool:
            await poll(client, sku, tickets[0])
            return bool(await redis.zcard(wait_key) == 29)

        await wait_for(someone_in, within=10, what="the first admission after the start")
        _, late = await join(client, sku, "late")
        assert late["position"] == 30
        line = await queue_line(redis, wait_key)
        assert line[-1] == late["ticket"]
        early_line = line[:-1]
        assert len(set(tickets) - set(early_line)) == 1 and set(early_line) <= set(tickets)
        assert early_line != [t for t in tickets if t in early_line], "not shuffled"
        await poll(client, sku, tickets[1])
        now_line = (await queue_line(redis, wait_key))[:-1]
        assert now_line == early_line[len(early_line) - len(now_line) :], "shuffled twice"
