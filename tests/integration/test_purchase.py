"""The purchase path end to end through the HTTP app, on real Redis and PostgreSQL."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from gateway.redis.layout import SkuKeys, lock_key
from testkit.polling import wait_for
from testkit.purchases import (
    ADMIN_HEADERS,
    answer_of,
    buy,
    client_metric,
    counts,
    db_state,
    look_up,
    put_sku,
    redis_state,
    wait_sold_out_marked,
)


class TestSale:
    """A storm of purchases sells exactly the stock, to distinct users."""

    @pytest.mark.parametrize("flush_lock", ["redis", "postgres", "none"])
    async def test_two_thousand_purchases_by_a_thousand_users_sell_exactly_one_hundred(
        self,
        start_gateway: Any,
        sku: str,
        database_url: str,
        redis: Redis,
        key_prefix: str,
        flush_lock: str,
    ) -> None:
        """Each of 1,000 users buys twice at once: 100 confirmed, the rest sold_out
        or duplicate, database and Redis both at zero, the ledger empty; with each
        flush lock backend and with none."""
        client = await start_gateway(flush_lock=flush_lock)
        await put_sku(client, sku, 100)
        calls = [buy(client, sku, f"user{i}", f"r{i}-{n}") for n in range(2) for i in range(1000)]
        results = await asyncio.gather(*calls)
        statuses = collections.Counter(status for status, _ in results)
        outcomes = collections.Counter(body.get("status") for _, body in results)
        assert not [s for s in statuses if s >= 500], statuses
        assert outcomes["confirmed"] == 100
        assert outcomes["sold_out"] + outcomes["duplicate"] == 1900
        confirmed_users = [b["user_id"] for _, b in results if b.get("status") == "confirmed"]
        assert len(set(confirmed_users)) == 100
        assert await db_state(database_url, sku) == (0, 100, 100)
        assert await redis_state(redis, key_prefix, sku) == (0, 0)

    async def test_last_unit_and_the_unit_after_it(self, start_gateway: Any, sku: str) -> None:
        """With one unit left the next buyer gets it and the one after is sold out."""
        client = await start_gateway()
        await put_sku(client, sku, 1)
        assert (await buy(client, sku, "first"))[0] == 201
        assert await buy(client, sku, "second") == (409, {"status": "sold_out"})


class TestIdempotency:
    """The same request id always gets its first outcome and never a second order."""

    async def test_replay_of_a_confirmed_request_after_sold_out_returns_its_order(
        self, start_gateway: Any, sku: str, database_url: str, redis: Redis, key_prefix: str
    ) -> None:
        """After the sku sold out (answered in-process), a replay of a confirmed
        request id still returns 201 with the same order_id."""
        client = await start_gateway()
        await put_sku(client, sku, 2)
        status, first = await buy(client, sku, "alice", "req-alice")
        assert status == 201
        assert (await buy(client, sku, "bob"))[0] == 201
        assert (await buy(client, sku, "carol"))[1] == {"status": "sold_out"}
        await wait_sold_out_marked(client, sku)
        # From here on the answers come from the process (and, for a replay
        # Redis no longer knows, the order rows): nothing is reloaded.
        keys = SkuKeys.of(key_prefix, sku)
        await redis.delete(*keys.all())
        status, again = await buy(client, sku, "alice", "req-alice")
        assert (status, again) == (201, first)
        assert (await buy(client, sku, "dave"))[1] == {"status": "sold_out"}
        assert await redis.exists(keys.stock) == 0
        assert (await db_state(database_url, sku))[1] == 2

    async def test_idempotency_key_header_is_the_request_id(
        self, start_gateway: Any, sku: str
    ) -> None:
        """Without request_id in the body the Idempotency-Key header identifies it."""
        client = await start_gateway()
        await put_sku(client, sku, 5)
        body = {"sku": sku, "user_id": "dave"}
        headers = {"Idempotency-Key": f"{sku}.key-1"}
        first = await (await client.post("/v1/purchase", json=body, headers=headers)).json()
        second = await (await client.post("/v1/purchase", json=body, headers=headers)).json()
        assert first["request_id"] == f"{sku}.key-1"
        assert second == first

    async def test_same_user_with_a_new_request_id_is_a_duplicate(
        self, start_gateway: Any, sku: str
    ) -> None:
        """One order per user and sku: a second request id of the same user is refused."""
        client = await start_gateway()
        await put_sku(client, sku, 5)
        assert (await buy(client, sku, "erin", "e1"))[0] == 201
        assert await buy(client, sku, "erin", "e2") == (409, {"status": "duplicate"})

    async def test_order_lookup(self, start_gateway: Any, sku: str) -> None:
        """GET /v1/orders/{request_id}?user_id= returns the order to its buyer as
        its 201 did (its status and pay_by too); an unknown request id is a JSON 404."""
        client = await start_gateway()
        await put_sku(client, sku, 5)
        _, order = await buy(client, sku, "finn", "f1")
        status, body = await look_up(client, f"{sku}.f1", "finn")
        assert (status, body) == (200, order)
        status, body = await look_up(client, "nope", "finn")
        assert (status, body["error"]) == (404, "not_found")

    async def test_an_order_is_hidden_from_all_but_its_buyer(
        self, start_gateway: Any, sku: str
    ) -> None:
        """Looked up without a user_id, or with another buyer's, a confirmed
        request id gets exactly what it got before it was bought: the same 404,
        body and headers; a user_id that is no id at all is a 400, as anywhere."""
        client = await start_gateway()
        await put_sku(client, sku, 5)
        rid = f"{sku}.g1"
        probes = ("", "?user_id=mallory", "?user_id=mallory&wait=1")
        unknown = [await answer_of(client, f"/v1/orders/{rid}{probe}") for probe in probes]
        assert unknown[0][0] == 404 and len(set(unknown)) == 1
        assert (await buy(client, sku, "gina", "g1"))[0] == 201
        for probe in probes:
            assert await answer_of(client, f"/v1/orders/{rid}{probe}") == unknown[0], probe
        assert (await look_up(client, rid, "gina"))[0] == 200
        for malformed in ("", "not an id", "x" * 65):
            status, body = await look_up(client, rid, malformed)
            assert (status, body["error"]) == (400, "invalid_request"), malformed


class TestPerUserLimit:
    """qty may go up to the sku's per_user_limit and no further."""

    async def test_limit(self, start_gateway: Any, sku: str) -> None:
        """qty over the limit is a 400; qty at the limit is one order of that qty."""
        client = await start_gateway()
        await put_sku(client, sku, 10, limit=3)
        status, body = await buy(client, sku, "gina", qty=4)
        assert status == 400
        assert body["error"] == "invalid_request"
        assert "limit" in body["detail"]
        status, body = await buy(client, sku, "gina", qty=3)
        assert (status, body["qty"]) == (201, 3)
        resp = await client.get(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)
        assert counts(await resp.json()) == {
            "db_stock": 7,
            "redis_stock": 7,
            "pending": 0,
            "sold": 3,
        }

    async def test_bigger_qty_than_remaining_is_sold_out_and_smaller_still_sells(
        self, start_gateway: Any, sku: str
    ) -> None:
        """With 2 left, a request for 3 is sold out but one for 2 succeeds."""
        client = await start_gateway()
        await put_sku(client, sku, 2, limit=3)
        assert (await buy(client, sku, "hank", qty=3))[1] == {"status": "sold_out"}
        assert (await buy(client, sku, "ivan", qty=2))[0] == 201


class TestFencing:
    """A flush fenced out is retried under a fresh acquisition: applied once, not lost."""

    async def test_fenced_out_flush_is_retried_with_a_new_token(
        self, start_gateway: Any, sku: str, database_url: str, redis: Redis, key_prefix: str
    ) -> None:
        """The row carries a token one ahead of the next one the lock hands out: the
        first attempt is rejected by PostgreSQL, the retry's newer token passes."""
        client = await start_gateway(flush_lock="redis")
        await put_sku(client, sku, 5)
        assert (await buy(client, sku, "warmup"))[0] == 201
        # The next flush takes the lock anew once the warm-up's hold is let go.
        key = lock_key(key_prefix, sku)
        await wait_for(lambda: _gone(redis, key), within=5, what="the warm-up's lock let go")
        # Tokens follow a counter never behind Redis's clock (in microseconds):
        # put the counter far ahead of the clock so the next two are known.
        issued = 2**52  # ahead of the clock, and exact in Lua's doubles
        await redis.set(f"{lock_key(key_prefix, sku)}:fence", issued)
        con = await asyncpg.connect(database_url)
        try:
            await con.execute("UPDATE inventory SET fence = $2 WHERE sku = $1", sku, issued + 2)
        finally:
            await con.close()
        status, body = await buy(client, sku, "fenced", "f1")
        assert (status, body["status"]) == (201, "confirmed")
        assert await db_state(database_url, sku) == (3, 2, 2)
        metrics = await (await client.get("/metrics")).text()
        assert "flashsale_fenced_out_total 1.0" in metrics

    async def test_the_lock_kept_through_an_empty_lane_is_let_go(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str, database_url: str
    ) -> None:
        """The flusher keeps a sku's lock through its empty lane until its slice
        ends, then lets go with nothing more arriving: the lock is not left
        to its lease, and the watchdog does not keep it for good. An admin
        change right after a purchase waits for the slice, not for the lease."""
        client = await start_gateway(flush_lock="redis")
        await put_sku(client, sku, 5)
        assert (await buy(client, sku, "first"))[0] == 201
        resp = await client.post(
            f"/admin/skus/{sku}/restock", json={"delta": 2}, headers=ADMIN_HEADERS
        )
        assert resp.status == 200, await resp.text()
        assert (await buy(client, sku, "second"))[0] == 201
        key = lock_key(key_prefix, sku)
        await wait_for(lambda: _gone(redis, key), within=5, what="the flush lock let go")
        assert await db_state(database_url, sku) == (5, 2, 2)

    async def test_buyers_one_after_another_do_not_take_the_lock_each_time(
        self, start_gateway: Any, sku: str
    ) -> None:
        """A closed loop of buyers runs the sku's lane empty after every flush and
        refills it moments later: the flusher keeps its lock through those gaps
        instead of a Redis round trip to take it again before every commit."""
        client = await start_gateway(flush_lock="redis")
        await put_sku(client, sku, 100)
        for i in range(40):
            assert (await buy(client, sku, f"u{i}"))[0] == 201
        taken = await client_metric(client, "flashsale_lock_acquisitions_total")
        # Taken anew only where a gap ran long (the first gap has no pace yet).
        assert 1 <= taken <= 20, taken

    async def test_a_stale_token_never_writes(
        self, start_gateway: Any, sku: str, database_url: str, redis: Redis, key_prefix: str
    ) -> None:
        """When every retry is still behind the row's token the purchase gets 503 and
        its reservation is given back: nothing applied, nothing lost."""
        client = await start_gateway(flush_lock="redis")
        await put_sku(client, sku, 5)
        con = await asyncpg.connect(database_url)
        try:
            await con.execute("UPDATE inventory SET fence = $2 WHERE sku = $1", sku, 2**62)
        finally:
            await con.close()
        status, body = await buy(client, sku, "stale", "s1")
        assert (status, body["error"]) == (503, "unavailable")
        assert await db_state(database_url, sku) == (5, 0, 0)
        assert await redis_state(redis, key_prefix, sku) == (5, 0)


class TestSoldOutStorm:
    """The moment a sku sells out, a storm of requests costs one pass over its orders."""

    async def test_confirmed_ids_are_read_once_per_sell_out(
        self, start_gateway: Any, sku: str
    ) -> None:
        """200 requests arriving together after the last unit sold all get sold_out,
        and the sku's confirmed request ids are read from Redis once, not 200 times
        (nor again for 200 more once the mark is up)."""
        client = await start_gateway()
        await put_sku(client, sku, 1)
        assert (await buy(client, sku, "winner"))[0] == 201
        results = await asyncio.gather(*(buy(client, sku, f"late{i}") for i in range(200)))
        assert {body["status"] for _, body in results} == {"sold_out"}
        await wait_sold_out_marked(client, sku)
        more = await asyncio.gather(*(buy(client, sku, f"later{i}") for i in range(200)))
        assert {body["status"] for _, body in more} == {"sold_out"}
        assert await client_metric(client, "flashsale_confirmed_id_builds_total") == 1
        assert await client_metric(client, "flashsale_confirmed_ids_read_total") == 1


async def _gone(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)
