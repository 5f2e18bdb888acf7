"""The queue strategy through the HTTP app, on real Redis and PostgreSQL: 202 once
the purchase is in the sku's stream, a writer commits it, and
``GET /v1/orders/{request_id}`` follows it to its final answer."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.domain.model import Strategy
from gateway.redis.layout import WRITERS_GROUP, SkuKeys, request_key, stream_key
from testkit.polling import wait_for
from testkit.purchases import (
    ADMIN_HEADERS,
    Client,
    answer_of,
    buy,
    client_metric,
    db_state,
    look_up,
    put_sku,
    redis_state,
)

QUEUE = {"strategy": Strategy.QUEUE, "writer_claim_idle_s": 0.5, "writer_block_ms": 200}


async def final_status(client: Client, request_id: str, user: str) -> tuple[int, Any]:
    """The answer to the request id's buyer once final (long polls until it is not 202)."""

    async def final() -> tuple[int, Any] | None:
        status, body = await look_up(client, request_id, user, wait=5)
        return None if status == 202 else (status, body)

    return await wait_for(final, within=30, what=f"final answer of {request_id}")


class TestAccepted:
    """A purchase is answered 202 once queued and followed to its order."""

    async def test_accepted_then_confirmed_by_the_writer(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """POST answers 202 with the request id; a long poll answers 200 with the
        order, which is the row PostgreSQL holds."""
        client = await start_gateway(**QUEUE)
        await put_sku(client, sku, 5)
        status, body = await buy(client, sku, "alice", "r1")
        assert (status, body) == (202, {"status": "accepted", "request_id": f"{sku}.r1"})
        status, order = await final_status(client, f"{sku}.r1", "alice")
        assert status == 200
        assert (order["sku"], order["user_id"], order["qty"]) == (sku, "alice", 1)
        assert await db_state(database_url, sku) == (4, 1, 1)

    async def test_unknown_request_id_is_404_and_a_bad_wait_is_400(
        self, start_gateway: Any, sku: str
    ) -> None:
        """An id never seen is a JSON 404; a wait that is not 0..30 seconds a 400."""
        client = await start_gateway(**QUEUE)
        status, body = await look_up(client, f"{sku}.nobody", "nobody")
        assert (status, body["error"]) == (404, "not_found")
        for wait in ("-1", "31", "soon", "nan"):
            resp = await client.get(f"/v1/orders/{sku}.x", params={"wait": wait})
            assert resp.status == 400, wait
            assert (await resp.json())["error"] == "invalid_request"

    async def test_queued_purchase_waits_for_a_writer_and_is_never_reconciled_away(
        self, start_gateway: Any, sku: str, database_url: str, redis: Redis, key_prefix: str
    ) -> None:
        """Without a writer the purchase stays queued: its status and a repeat of
        the request answer 202, the reconciler does not release it however old it
        is, and a gateway with a writer started later commits it."""
        client = await start_gateway(
            **QUEUE, queue_writer=False, reservation_timeout_s=0.1, reconcile_interval_s=3600
        )
        await put_sku(client, sku, 3)
        assert (await buy(client, sku, "bob", "r1"))[0] == 202
        assert await buy(client, sku, "bob", "r1") == (
            202,
            {"status": "accepted", "request_id": f"{sku}.r1"},
        )
        assert (await look_up(client, f"{sku}.r1", "bob"))[0] == 202
        assert await redis.xlen(stream_key(key_prefix, sku)) == 1
        # Older than the reservation timeout, and reconciled: still queued.
        await asyncio.sleep(0.2)
        done = await (await client.post("/admin/reconcile", headers=ADMIN_HEADERS)).json()
        assert done[sku]["released"] == 0
        assert await redis_state(redis, key_prefix, sku) == (2, 1)
        assert (await look_up(client, f"{sku}.r1", "bob"))[0] == 202
        writer = await start_gateway(**QUEUE)
        status, order = await final_status(writer, f"{sku}.r1", "bob")
        assert (status, order["user_id"]) == (200, "bob")
        assert await db_state(database_url, sku) == (2, 1, 1)


class TestPrivacy:
    """A queued purchase is shown to its buyer alone, whatever the wait."""

    async def test_a_queued_or_refused_purchase_reads_as_unknown_to_others(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """While two purchases wait in the queue, and once one is confirmed and
        the other refused (Redis believed in a unit the database lacks), a
        lookup of either without a user_id or with another buyer's, long poll
        or not, gets what it got before the purchase: the same 404, body and
        headers. It is answered at once, while the buyer's own long poll is
        still held; the buyers see 202, then 200 and 409 sold_out."""
        client = await start_gateway(**QUEUE, queue_writer=False)
        await put_sku(client, sku, 1)
        await redis.set(SkuKeys.of(key_prefix, sku).stock, 2)
        queries = ("", "?wait=30", "?user_id=eve", "?user_id=eve&wait=30")

        async def answers(rid: str) -> set[tuple[int, bytes, tuple[tuple[str, str], ...]]]:
            return {await answer_of(client, f"/v1/orders/{sku}.{rid}{q}") for q in queries}

        unknown = {rid: await answers(rid) for rid in ("p1", "p2")}
        assert [next(iter(a))[0] for a in unknown.values()] == [404, 404]
        assert [len(a) for a in unknown.values()] == [1, 1]
        for user in ("pat", "quinn"):
            assert (await buy(client, sku, user, "p1" if user == "pat" else "p2"))[0] == 202
        held = asyncio.ensure_future(look_up(client, f"{sku}.p2", "quinn", wait=30))
        assert {rid: await answers(rid) for rid in ("p1", "p2")} == unknown
        assert not held.done()
        writer = await start_gateway(**QUEUE)
        assert await held == (409, {"status": "sold_out"})
        assert (await final_status(writer, f"{sku}.p1", "pat"))[0] == 200
        assert {rid: await answers(rid) for rid in ("p1", "p2")} == unknown

    async def test_a_request_recorded_without_its_buyer_is_shown_to_nobody(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """A request id queued by a gateway from before buyers were recorded (its
        request key holds the sku alone) reads as unknown to everyone, its own
        buyer included, rather than to anyone."""
        client = await start_gateway(**QUEUE, queue_writer=False)
        await put_sku(client, sku, 1)
        assert (await buy(client, sku, "ray", "r1"))[0] == 202
        assert (await look_up(client, f"{sku}.r1", "ray"))[0] == 202
        await redis.set(request_key(key_prefix, f"{sku}.r1"), sku)
        for user in ("ray", "eve"):
            assert (await look_up(client, f"{sku}.r1", user))[0] == 404, user


class TestRefused:
    """A queued purchase the database refuses ends as 409, durably answered."""

    async def test_redis_ahead_of_the_database_ends_sold_out(
        self, start_gateway: Any, sku: str, database_url: str, redis: Redis, key_prefix: str
    ) -> None:
        """Redis believes in 3 units the database does not have (2 of them): all
        three buyers get 202, one order is committed, the other two end 409
        sold_out, and Redis is brought back to the database's count."""
        client = await start_gateway(**QUEUE)
        await put_sku(client, sku, 1)
        await redis.set(SkuKeys.of(key_prefix, sku).stock, 3)
        for user in ("a", "b", "c"):
            assert (await buy(client, sku, user, user))[0] == 202
        answers = [await final_status(client, f"{sku}.{user}", user) for user in ("a", "b", "c")]
        statuses = collections.Counter(status for status, _ in answers)
        assert statuses == {200: 1, 409: 2}
        assert [b for s, b in answers if s == 409] == [{"status": "sold_out"}] * 2
        assert await db_state(database_url, sku) == (0, 1, 1)
        assert await redis_state(redis, key_prefix, sku) == (0, 0)

    async def test_buyer_holding_an_order_ends_duplicate(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str, database_url: str
    ) -> None:
        """Redis forgot a buyer's order (its hashes were lost): the second purchase is
        accepted, and the database's unique (sku, user) makes it 409 duplicate."""
        client = await start_gateway(**QUEUE)
        await put_sku(client, sku, 5)
        assert (await buy(client, sku, "dora", "first"))[0] == 202
        assert (await final_status(client, f"{sku}.first", "dora"))[0] == 200
        keys = SkuKeys.of(key_prefix, sku)
        await redis.delete(keys.buyers, keys.done)
        assert (await buy(client, sku, "dora", "second"))[0] == 202
        assert await final_status(client, f"{sku}.second", "dora") == (409, {"status": "duplicate"})
        assert await db_state(database_url, sku) == (4, 1, 1)


class TestStorm:
    """Under a storm the queue sells exactly the stock, to distinct users."""

    @pytest.mark.parametrize("flush_lock", ["redis", "postgres", "none"])
    async def test_two_thousand_purchases_sell_exactly_one_hundred(
        self,
        start_gateway: Any,
        sku: str,
        database_url: str,
        redis: Redis,
        key_prefix: str,
        flush_lock: str,
    ) -> None:
        """1,000 users buy twice at once through two gateways (two writers): every
        202 ends 200, every other answer is 409; 100 orders, 100 users, Redis and
        the database at zero, the ledger and the stream empty; with each flush
        lock backend and with none (then the row lock alone orders the writers)."""
        first = await start_gateway(**QUEUE, flush_lock=flush_lock)
        second = await start_gateway(**QUEUE, flush_lock=flush_lock)
        await put_sku(first, sku, 100)
        clicks = [(n, f"user{i}", f"r{i}-{n}") for n in range(2) for i in range(1000)]
        calls = [buy((first, second)[n], sku, user, rid) for n, user, rid in clicks]
        results = await asyncio.gather(*calls)
        statuses = collections.Counter(status for status, _ in results)
        assert set(statuses) <= {202, 409}, statuses
        assert statuses[202] == 100
        users = [user for _, user, _ in clicks]
        accepted = [
            (b["request_id"], u) for u, (s, b) in zip(users, results, strict=True) if s == 202
        ]
        finals = await asyncio.gather(*(final_status(first, rid, u) for rid, u in accepted))
        assert collections.Counter(s for s, _ in finals) == {200: 100}
        assert len({order["user_id"] for _, order in finals}) == 100
        assert await db_state(database_url, sku) == (0, 100, 100)
        assert await redis_state(redis, key_prefix, sku) == (0, 0)
        assert await redis.xlen(stream_key(key_prefix, sku)) == 0
        assert (
            await client_metric(first, "flashsale_writer_batches_total")
            + (await client_metric(second, "flashsale_writer_batches_total"))
            >= 1
        )

    async def test_skus_without_a_queued_purchase_hold_no_connection(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """With 30 skus in the inventory and 4 Redis connections, a purchase of
        one sku is still confirmed at once: the writer only reads the streams
        that exist, so idle skus hold no blocking read."""
        client = await start_gateway(**QUEUE, redis_pool_size=4)
        for n in range(30):
            await put_sku(client, f"{sku}-idle{n}", 1)
        await put_sku(client, sku, 1)
        assert (await buy(client, sku, "zed", "r1"))[0] == 202
        assert (await final_status(client, f"{sku}.r1", "zed"))[0] == 200
        assert await db_state(database_url, sku) == (0, 1, 1)

    async def test_full_stream_sheds_503_without_reserving(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """With the stream at its bound a purchase is 503 with Retry-After, and
        Redis stock is untouched."""
        client = await start_gateway(**QUEUE, queue_writer=False, stream_max=2)
        await put_sku(client, sku, 10)
        assert [(await buy(client, sku, u, u))[0] for u in ("a", "b")] == [202, 202]
        resp = await client.post(
            "/v1/purchase", json={"sku": sku, "user_id": "c", "request_id": f"{sku}.c"}
        )
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "1"
        assert (await resp.json())["error"] == "unavailable"
        assert await redis_state(redis, key_prefix, sku) == (8, 2)


class TestReclaim:
    """A dead writer's entries are claimed and committed once."""

    async def test_entries_read_by_a_dead_writer_are_claimed(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str, database_url: str
    ) -> None:
        """A consumer reads three entries and never acknowledges them (it died): a
        writer claims them after the idle time and commits them, and the reclaim
        shows in the metrics."""
        accepter = await start_gateway(**QUEUE, queue_writer=False)
        await put_sku(accepter, sku, 10)
        for user in ("a", "b", "c"):
            assert (await buy(accepter, sku, user, user))[0] == 202
        key = stream_key(key_prefix, sku)
        await redis.xgroup_create(key, WRITERS_GROUP, "0", mkstream=True)
        read: Any = await redis.xreadgroup(WRITERS_GROUP, "dead-writer", {key: ">"}, count=10)
        assert len(read[0][1]) == 3
        writer = await start_gateway(**QUEUE)
        finals = [await final_status(writer, f"{sku}.{u}", u) for u in ("a", "b", "c")]
        assert [s for s, _ in finals] == [200, 200, 200]
        assert await client_metric(writer, "flashsale_stream_reclaimed_total") == 3
        assert await db_state(database_url, sku) == (7, 3, 3)
        assert (await redis.xpending(key, WRITERS_GROUP))["pending"] == 0

    @pytest.mark.parametrize("replays", [1, 2])
    async def test_committed_batch_replayed_changes_nothing(
        self,
        start_gateway: Any,
        sku: str,
        redis: Redis,
        key_prefix: str,
        database_url: str,
        replays: int,
    ) -> None:
        """Entries committed and settled but put back in the stream (a writer killed
        before its XACK) are committed again: no second order, no stock moved."""
        client = await start_gateway(**QUEUE)
        await put_sku(client, sku, 10)
        assert (await buy(client, sku, "eve", "r1"))[0] == 202
        status, order = await final_status(client, f"{sku}.r1", "eve")
        assert status == 200
        key = stream_key(key_prefix, sku)
        for _ in range(replays):
            fields = {"rid": f"{sku}.r1", "user": "eve", "qty": "1", "at": "1"}
            await redis.xadd(key, fields)  # type: ignore[arg-type]

        async def drained() -> bool:
            return await redis.xlen(key) == 0

        await wait_for(drained, within=10, what="the replayed entries to be acknowledged")
        assert await look_up(client, f"{sku}.r1", "eve") == (200, order)
        assert await db_state(database_url, sku) == (9, 1, 1)
        assert await redis_state(redis, key_prefix, sku) == (9, 0)
