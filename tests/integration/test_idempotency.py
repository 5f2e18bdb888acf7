"""Idempotency as draft-ietf-httpapi-idempotency-key-header says, on real Redis and
PostgreSQL: the same request id and payload get the first outcome; another payload
gets 422 and never the other purchase's order; an invalid header is a 400."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.redis.layout import SkuKeys
from testkit.purchases import (
    Client,
    buy,
    client_metric,
    db_state,
    put_sku,
    wait_sold_out_marked,
)


async def post(client: Client, body: dict[str, Any], key: str | None = None) -> tuple[int, Any]:
    """``POST /v1/purchase`` with an optional Idempotency-Key header."""
    headers = {} if key is None else {"Idempotency-Key": key}
    resp = await client.post("/v1/purchase", json=body, headers=headers)
    return resp.status, await resp.json()


async def confirmed_then(
    client: Client, sku: str, first: dict[str, Any], again: dict[str, Any]
) -> tuple[int, Any]:
    """Confirm ``first`` (request id k1), then send ``again`` under the same id."""
    status, body = await post(client, {"sku": sku, "request_id": f"{sku}.k1", **first})
    assert status == 201, body
    return await post(client, {"sku": sku, "request_id": f"{sku}.k1", **again})


class TestMismatch:
    """The same request id with another payload is refused, wherever its outcome is kept."""

    @pytest.mark.parametrize(
        "again",
        [{"user_id": "gus", "qty": 1}, {"user_id": "fay", "qty": 2}],
        ids=["another-user", "another-qty"],
    )
    async def test_another_payload_gets_422_from_redis(
        self, start_gateway: Any, sku: str, database_url: str, again: dict[str, Any]
    ) -> None:
        """fay's confirmed request id sent for gus (or for 2 units) is a 422 naming
        the mismatch, gus gets no order, and fay's order is untouched."""
        client = await start_gateway()
        await put_sku(client, sku, 5, limit=2)
        status, body = await confirmed_then(client, sku, {"user_id": "fay", "qty": 1}, again)
        assert status == 422
        assert body["error"] == "idempotency_mismatch" and "detail" in body
        assert "order_id" not in body
        assert await db_state(database_url, sku) == (4, 1, 1)
        # The right payload still gets the first outcome.
        status, replay = await post(
            client, {"sku": sku, "user_id": "fay", "qty": 1, "request_id": f"{sku}.k1"}
        )
        assert status == 201 and replay["user_id"] == "fay"

    async def test_the_idempotency_key_header_of_someone_else_gets_422(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """The issue's case: Idempotency-Key k1 confirms fay's order; the same key
        sent for gus answers 422, not fay's order."""
        client = await start_gateway()
        await put_sku(client, sku, 5)
        key = f"{sku}.k1"
        status, fay = await post(client, {"sku": sku, "user_id": "fay"}, key)
        assert status == 201
        status, gus = await post(client, {"sku": sku, "user_id": "gus"}, key)
        assert (status, gus["error"]) == (422, "idempotency_mismatch")
        assert fay["order_id"] not in str(gus)
        assert (await db_state(database_url, sku))[1] == 1

    async def test_another_sku_gets_422_from_the_order_row(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """A request id used for one sku and sent again for another is refused by
        PostgreSQL (the other sku's Redis keys know nothing of it); the stock it
        reserved there goes back."""
        client = await start_gateway()
        other = f"{sku}-b"
        await put_sku(client, sku, 3)
        await put_sku(client, other, 3)
        rid = f"{sku}.k1"
        assert (await post(client, {"sku": sku, "user_id": "fay", "request_id": rid}))[0] == 201
        status, body = await post(client, {"sku": other, "user_id": "fay", "request_id": rid})
        assert (status, body["error"]) == (422, "idempotency_mismatch")
        assert await db_state(database_url, other) == (3, 0, 0)
        available = await (await client.get(f"/v1/skus/{other}")).json()
        assert available["available"] == 3

    async def test_422_survives_redis_losing_everything(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """With every key of the sku gone, the mismatch is still refused and the
        replay still confirmed (the order rows decide, then Redis is rebuilt)."""
        client = await start_gateway()
        await put_sku(client, sku, 3)
        rid = f"{sku}.k1"
        assert (await post(client, {"sku": sku, "user_id": "fay", "request_id": rid}))[0] == 201
        await redis.delete(*SkuKeys.of(key_prefix, sku).all())
        status, body = await post(client, {"sku": sku, "user_id": "gus", "request_id": rid})
        assert (status, body["error"]) == (422, "idempotency_mismatch")
        status, body = await post(client, {"sku": sku, "user_id": "fay", "request_id": rid})
        assert (status, body["user_id"]) == (201, "fay")

    async def test_422_on_a_sold_out_sku_answered_in_process(
        self, start_gateway: Any, sku: str
    ) -> None:
        """After the sku sold out, a confirmed id with another payload is refused
        too, and the right one still gets its order."""
        client = await start_gateway()
        await put_sku(client, sku, 1)
        rid = f"{sku}.k1"
        status, first = await post(client, {"sku": sku, "user_id": "fay", "request_id": rid})
        assert status == 201
        assert (await buy(client, sku, "late"))[1] == {"status": "sold_out"}
        await wait_sold_out_marked(client, sku)
        status, body = await post(client, {"sku": sku, "user_id": "gus", "request_id": rid})
        assert (status, body["error"]) == (422, "idempotency_mismatch")
        assert await post(client, {"sku": sku, "user_id": "fay", "request_id": rid}) == (
            201,
            first,
        )


class TestHeader:
    """An Idempotency-Key header is checked whether or not the body has a request id."""

    @pytest.mark.parametrize("with_body_id", [False, True], ids=["header-only", "with-body-id"])
    async def test_an_invalid_header_is_a_400(
        self, start_gateway: Any, sku: str, database_url: str, with_body_id: bool
    ) -> None:
        """A key longer than 64 characters is refused, even beside a valid body id."""
        client = await start_gateway()
        await put_sku(client, sku, 3)
        body: dict[str, Any] = {"sku": sku, "user_id": "fay"}
        if with_body_id:
            body["request_id"] = f"{sku}.k1"
        status, answer = await post(client, body, "k" * 65)
        assert (status, answer["error"]) == (400, "invalid_request")
        assert "Idempotency-Key" in answer["detail"]
        assert (await db_state(database_url, sku))[1] == 0

    async def test_a_header_and_body_naming_different_requests_is_a_400(
        self, start_gateway: Any, sku: str, database_url: str
    ) -> None:
        """Header k1 and body request_id k2 contradict each other: 400, no order."""
        client = await start_gateway()
        await put_sku(client, sku, 3)
        body = {"sku": sku, "user_id": "fay", "request_id": f"{sku}.k2"}
        status, answer = await post(client, body, f"{sku}.k1")
        assert (status, answer["error"]) == (400, "invalid_request")
        assert (await db_state(database_url, sku))[1] == 0

    async def test_a_structured_field_string_names_the_same_request(
        self, start_gateway: Any, sku: str
    ) -> None:
        """The draft's form ``"k1"`` and the bare ``k1`` are one request id."""
        client = await start_gateway()
        await put_sku(client, sku, 3)
        status, first = await post(client, {"sku": sku, "user_id": "fay"}, f'"{sku}.k1"')
        assert status == 201 and first["request_id"] == f"{sku}.k1"
        assert await post(client, {"sku": sku, "user_id": "fay"}, f"{sku}.k1") == (201, first)
        order = await client.get(f"/v1/orders/{sku}.k1", params={"user_id": "fay"})
        assert (await order.json())["order_id"] == first["order_id"]


class TestBigSale:
    """Replays after a sale of thousands: every confirmed id keeps its order."""

    async def test_a_sample_of_replays_after_thousands_of_orders(
        self, start_gateway: Any, sku: str
    ) -> None:
        """3,000 units sold to 3,000 buyers; then 300 replays of confirmed ids get
        their orders and 300 new ids get sold_out, after one pass over the orders."""
        client = await start_gateway(batch_max=512)
        stock = 3000
        await put_sku(client, sku, stock)
        first: dict[str, str] = {}
        for start in range(0, stock, 250):
            results = await asyncio.gather(
                *(buy(client, sku, f"u{i}", f"r{i}") for i in range(start, start + 250))
            )
            for status, body in results:
                assert status == 201, body
                first[body["request_id"]] = body["order_id"]
        assert (await buy(client, sku, "late"))[1] == {"status": "sold_out"}
        await wait_sold_out_marked(client, sku)
        sample = random.Random(7).sample(range(stock), 300)
        replays = await asyncio.gather(*(buy(client, sku, f"u{i}", f"r{i}") for i in sample))
        for status, body in replays:
            assert status == 201 and body["order_id"] == first[body["request_id"]]
        news = await asyncio.gather(*(buy(client, sku, f"n{i}", f"n{i}") for i in range(300)))
        assert {body["status"] for _, body in news} == {"sold_out"}
        assert await client_metric(client, "flashsale_confirmed_id_builds_total") == 1
        assert await client_metric(client, "flashsale_confirmed_ids_read_total") == stock
