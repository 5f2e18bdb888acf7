"""What the shop's payment service reads and marks (issue 40), on real
PostgreSQL: the late payments, oldest first a page at a time, owed until
refunded once; and a buyer's orders, newest first a page at a time. Both under
the payment token alone."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.order_lifecycle import PAY_HEADERS, cancel, pay, put_window, start
from testkit.purchases import ADMIN_HEADERS, Client, buy


async def listed(client: Client, path: str, headers: dict[str, str], **query: str) -> Any:
    """A GET of ``path`` with ``query``: the JSON body, after asserting 200."""
    resp = await client.get(path, params=query, headers=headers)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def every_page(
    client: Client, path: str, key: str, headers: dict[str, str], **query: str
) -> list[Any]:
    """The items of every page, following ``next`` (at most 50 pages)."""
    found: list[Any] = []
    after: str | None = None
    for _ in range(50):
        body = await listed(client, path, headers, **query, **({"after": after} if after else {}))
        found += body[key]
        after = body["next"]
        if after is None:
            return found
    raise AssertionError("more than 50 pages")


class TestLatePayments:
    """GET /v1/late-payments and POST /v1/late-payments/{payment_id}/refund."""

    async def test_listed_oldest_first_and_refunded_once(
        self, start_gateway: Any, sku: str, events_db: str
    ) -> None:
        """Three late payments whose ids sort against their order (z, m, a):
        listed in the order they came, one a page with next; a refund answers
        200 refunded and again the same; it leaves the owed list for the
        refunded one; the admin route lists them in the same order. A database
        of its own: other tests' late payments would fill the pages."""
        client = await start(start_gateway, database_url=events_db)
        await put_window(client, sku, 3, 60, "sql-direct")
        ids = [f"{p}-{sku}" for p in ("z", "m", "a")]
        for n, payment_id in enumerate(ids):
            assert (await buy(client, sku, f"b{n}", f"b{n}"))[0] == 201
            assert (await cancel(client, sku, f"b{n}"))[0] == 200
            assert (await pay(client, sku, f"b{n}", payment_id))[0] == 409

        def mine(items: list[Any]) -> list[str]:
            return [p["payment_id"] for p in items if p["payment_id"] in ids]

        owed = await every_page(
            client, "/v1/late-payments", "late_payments", PAY_HEADERS, status="owed", limit="1"
        )
        assert mine(owed) == ids
        assert {p["status"] for p in owed if p["payment_id"] in ids} == {"owed"}
        resp = await client.post(f"/v1/late-payments/{ids[1]}/refund", headers=PAY_HEADERS)
        first = await resp.json()
        assert resp.status == 200 and first["status"] == "refunded", first
        assert set(first) == {"payment_id", "order_id", "status", "refunded_at"}
        assert first["payment_id"] == ids[1] and first["refunded_at"].endswith("Z")
        resp = await client.post(f"/v1/late-payments/{ids[1]}/refund", headers=PAY_HEADERS)
        assert (resp.status, await resp.json()) == (200, first)
        owed = await every_page(
            client, "/v1/late-payments", "late_payments", PAY_HEADERS, status="owed"
        )
        assert mine(owed) == [ids[0], ids[2]]
        refunded = await every_page(
            client, "/v1/late-payments", "late_payments", PAY_HEADERS, status="refunded"
        )
        assert mine(refunded) == [ids[1]]
        both = await every_page(client, "/admin/late-payments", "late_payments", ADMIN_HEADERS)
        assert mine(both) == ids

    async def test_refused_inputs_and_callers(self, start_gateway: Any) -> None:
        """No token or the admin's: 401; an unknown payment id: 404; a status,
        cursor or limit out of the contract: 400."""
        client = await start(start_gateway)
        for headers in ({}, ADMIN_HEADERS):
            assert (await client.get("/v1/late-payments", headers=headers)).status == 401
            resp = await client.post("/v1/late-payments/p1/refund", headers=headers)
            assert resp.status == 401
        resp = await client.post("/v1/late-payments/nope-x/refund", headers=PAY_HEADERS)
        assert (resp.status, (await resp.json())["error"]) == (404, "not_found")
        for query in ({"status": "late"}, {"after": "x"}, {"after": "-1"}, {"limit": "0"}):
            resp = await client.get("/v1/late-payments", params=query, headers=PAY_HEADERS)
            assert (resp.status, (await resp.json())["error"]) == (400, "invalid_request")


class TestBuyerOrders:
    """GET /v1/orders?user_id=U[&sku=&status=&after=&limit=]."""

    async def test_newest_first_with_filters_and_pages(self, start_gateway: Any, sku: str) -> None:
        """A buyer who bought, cancelled and bought again, and bought another
        sku: newest first, one a page with next; sku and status filter; another
        buyer's orders never show."""
        client = await start(start_gateway)
        other = f"{sku}-b"
        await put_window(client, sku, 5, 60, "sql-direct")
        await put_window(client, other, 5, 60, "sql-direct")
        buyer = f"u-{sku}"
        made = []
        for target, rid in ((sku, "first"), (sku, "again"), (other, "other")):
            assert (await buy(client, target, buyer, rid))[0] == 201
            made.append(f"{target}.{rid}")
            if rid == "first":
                assert (await cancel(client, sku, "first"))[0] == 200
        assert (await buy(client, sku, f"{buyer}-x", "x"))[0] == 201
        orders = await every_page(
            client, "/v1/orders", "orders", PAY_HEADERS, user_id=buyer, limit="1"
        )
        assert [o["request_id"] for o in orders] == made[::-1]
        assert orders[-1]["status"] == "cancelled" and orders[0]["created_at"].endswith("Z")
        of_sku = await listed(client, "/v1/orders", PAY_HEADERS, user_id=buyer, sku=sku)
        assert [o["request_id"] for o in of_sku["orders"]] == [made[1], made[0]]
        live = await listed(
            client, "/v1/orders", PAY_HEADERS, user_id=buyer, status="pending_payment"
        )
        assert [o["request_id"] for o in live["orders"]] == [made[2], made[1]]
        paid = await pay(client, other, "other", f"pay-{sku}-o")
        assert paid[0] == 200
        [shown] = (await listed(client, "/v1/orders", PAY_HEADERS, user_id=buyer, status="paid"))[
            "orders"
        ]
        assert (shown["request_id"], shown["payment_id"]) == (made[2], f"pay-{sku}-o")

    async def test_orders_made_at_one_instant_are_each_listed_once(
        self, start_gateway: Any, sku: str, con: Any
    ) -> None:
        """Twelve orders of one buyer with one created_at (written by hand: a
        flush's orders share their transaction's now()): the cursor breaks the
        tie by order id, so paging five at a time lists each exactly once."""
        client = await start(start_gateway)
        await put_window(client, sku, 12, 60, "sql-direct")
        buyer = f"u-{sku}"
        await con.execute(
            "INSERT INTO orders (request_id, sku, user_id, qty, status, created_at)"
            " SELECT $1 || '.' || g, $1, $2, 1, 'cancelled', '2026-12-01T00:00:00Z'"
            " FROM generate_series(1, 12) g",
            sku,
            buyer,
        )
        orders = await every_page(
            client, "/v1/orders", "orders", PAY_HEADERS, user_id=buyer, limit="5"
        )
        assert sorted(o["request_id"] for o in orders) == sorted(f"{sku}.{g}" for g in range(1, 13))
        ids = [o["order_id"] for o in orders]
        assert ids == sorted(ids, reverse=True)

    @pytest.mark.parametrize(
        "query",
        [
            {},
            {"user_id": "a b"},
            {"user_id": "u", "status": "sold"},
            {"user_id": "u", "after": "12.not-a-uuid"},
            {"user_id": "u", "after": "١٢.00000000-0000-0000-0000-000000000000"},
            {"user_id": "u", "limit": "1001"},
            {"user_id": "u", "sku": "{x}"},
            {"user_id": "u", "page": "2"},
        ],
    )
    async def test_refused_queries(self, start_gateway: Any, query: dict[str, str]) -> None:
        """A query out of the contract is 400 invalid_request, with a JSON body."""
        client = await start(start_gateway)
        resp = await client.get("/v1/orders", params=query, headers=PAY_HEADERS)
        assert (resp.status, (await resp.json())["error"]) == (400, "invalid_request")

    async def test_without_the_token_a_user_id_reveals_nothing(
        self, start_gateway: Any, sku: str
    ) -> None:
        """No token, the admin's, or a wrong one: 401, the same whether the
        buyer has orders or not."""
        client = await start(start_gateway)
        await put_window(client, sku, 1, 60, "sql-direct")
        assert (await buy(client, sku, "has", "h"))[0] == 201
        answers = set()
        for user in ("has", "none"):
            for headers in ({}, ADMIN_HEADERS, {"Authorization": "Bearer wrong"}):
                resp = await client.get("/v1/orders", params={"user_id": user}, headers=headers)
                answers.add((resp.status, await resp.text()))
        assert len(answers) == 1 and next(iter(answers))[0] == 401
