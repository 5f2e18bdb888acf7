"""``GET /admin/skus/{sku}`` answers a sku's every setting and status beside its
counts (issue 40.7), on a real in-process gateway, Redis and PostgreSQL: what
a PUT set reads back as the PUT wrote it, the settings read put back change
nothing, ``sold`` splits into confirmed, paid and held, and an archived sku
says so with ``archived_at`` in the API's form of an instant (40.9)."""

from __future__ import annotations

import re
from typing import Any

import asyncpg
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from gateway.http.payloads import SKU_FIELDS
from testkit.order_lifecycle import pay, refund, start, status_of
from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS, Client, buy

# Every field a PUT takes, none at its default.
EVERY_SETTING: dict[str, Any] = {
    "stock": 7,
    "per_user_limit": 2,
    "starts_at": "2030-01-01T10:00:00.000Z",
    "ends_at": "2030-01-01T12:00:00.000Z",
    "user_rate": "5/s:10",
    "client_rate": "off",
    "waiting_room": {"admit_per_s": 3, "token_ttl_s": 120, "shuffle_at_start": True},
    "strategy": "optimistic",
    "payment_window_s": 5,
    "title": "Standing desk",
    "price_text": "¥99",
}
# An instant as the API writes every one: UTC, milliseconds, Z.
INSTANT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
MOVEMENTS = "SELECT count(*) FROM stock_movements WHERE sku = $1"


async def sheet(client: Client, sku: str) -> dict[str, Any]:
    """``GET /admin/skus/{sku}`` (asserts a 200)."""
    resp = await client.get(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def admin(client: Client, method: str, sku: str, body: Any = None) -> dict[str, Any]:
    """An admin change of ``sku`` (asserts a 200); its answer."""
    resp = await client.request(method, f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
    assert resp.status == 200, await resp.text()
    answer: dict[str, Any] = await resp.json()
    return answer


class TestSettings:
    """What a PUT set, read back."""

    async def test_every_setting_a_put_takes_reads_back_as_put(
        self, start_gateway: Any, sku: str
    ) -> None:
        """A sku with every setting away from its default answers each as the
        PUT gave it, its status (active, not archived) and its counts."""
        client = await start(start_gateway, admission_secret="sheet-admission-secret-0123456789")
        await admin(client, "PUT", sku, EVERY_SETTING)
        got = await sheet(client, sku)
        assert {name: got.get(name) for name in EVERY_SETTING} == EVERY_SETTING
        assert "image_url" not in got, "a display field not set is absent, as on every answer"
        assert got["status"] == "active" and got["archived_at"] is None
        assert got["sku"] == sku
        counts = (
            "db_stock",
            "redis_stock",
            "pending",
            "sold",
            "confirmed",
            "paid",
            "held",
            "refunded_not_restocked",
        )
        assert {name: got[name] for name in counts} == {
            "db_stock": 7,
            "redis_stock": None,
            "pending": 0,
            "sold": 0,
            "confirmed": 0,
            "paid": 0,
            "held": 0,
            "refunded_not_restocked": 0,
        }

    async def test_the_settings_read_put_back_change_nothing(
        self, start_gateway: Any, sku: str, make_settings: Any
    ) -> None:
        """A sku on the defaults and one with every setting: the settings a GET
        answers, PUT back and PATCHed back, leave the next GET as it was and
        write no stock movement."""
        client = await start(start_gateway, admission_secret="sheet-admission-secret-0123456789")
        database = await asyncpg.connect(make_settings().database_url)
        try:
            for name, body in ((f"{sku}-plain", {"stock": 3}), (sku, EVERY_SETTING)):
                await admin(client, "PUT", name, body)
                before = await sheet(client, name)
                movements = await database.fetchval(MOVEMENTS, name)
                settings = {k: v for k, v in before.items() if k in SKU_FIELDS}
                await admin(client, "PUT", name, settings)
                assert await sheet(client, name) == before, name
                await admin(client, "PATCH", name, settings)
                assert await sheet(client, name) == before, name
                assert await database.fetchval(MOVEMENTS, name) == movements, name
        finally:
            await database.close()


class TestCounts:
    """``sold`` and its split."""

    async def test_sold_splits_into_confirmed_paid_and_held(
        self, start_gateway: Any, sku: str
    ) -> None:
        """A sku with a payment window: three orders, one paid, is 1 paid and 2
        held of 3 sold; a sku without one: its order is confirmed."""
        client = await start(start_gateway)
        await admin(client, "PUT", sku, {"stock": 10, "payment_window_s": 600})
        for n in range(3):
            assert (await buy(client, sku, f"u{n}", f"r{n}"))[0] == 201
        assert (await pay(client, sku, "r0", f"{sku}-pay-0"))[0] == 200
        got = await sheet(client, sku)
        assert (got["sold"], got["confirmed"], got["paid"], got["held"]) == (3, 0, 1, 2)
        assert got["payment_window_s"] == 600
        plain = f"{sku}-final"
        await admin(client, "PUT", plain, {"stock": 4})
        assert (await buy(client, plain, "u0", "r0"))[0] == 201
        got = await sheet(client, plain)
        assert (got["sold"], got["confirmed"], got["paid"], got["held"]) == (1, 1, 0, 0)

    async def test_the_counts_add_up_to_the_stock_given_after_refunds(
        self, start_gateway: Any, sku: str
    ) -> None:
        """Of 10 units, four orders: one paid then refunded with restock, one paid
        then refunded without, one paid, one held. The refunded with restock is
        back in db_stock; the one without is in no live order, so not sold, and
        is counted apart: db_stock, sold and refunded_not_restocked add up to the
        10 given, as the audit's books do."""
        client = await start(start_gateway)
        await admin(client, "PUT", sku, {"stock": 10, "payment_window_s": 600})
        for n in range(4):
            assert (await buy(client, sku, f"u{n}", f"r{n}"))[0] == 201
        for n in range(3):
            assert (await pay(client, sku, f"r{n}", f"{sku}-pay-{n}"))[0] == 200
        assert (await refund(client, sku, "r0", restock=True))[0] == 200
        assert (await refund(client, sku, "r1", restock=False))[0] == 200
        got = await sheet(client, sku)
        assert (got["sold"], got["paid"], got["held"], got["refunded_not_restocked"]) == (
            2,
            1,
            1,
            1,
        )
        assert got["db_stock"] == 7
        assert got["db_stock"] + got["sold"] + got["refunded_not_restocked"] == 10


class TestArchived:
    """An archived sku."""

    async def test_an_archived_sku_says_so_with_an_instant_in_the_api_form(
        self, start_gateway: Any, sku: str
    ) -> None:
        """After a DELETE, the GET answers ``archived`` and the DELETE's
        ``archived_at``, its settings still there; every ``archived_at``
        (DELETE, GET, the listing) is UTC in milliseconds with a Z."""
        client = await start(start_gateway)
        await admin(client, "PUT", sku, {"stock": 2, "payment_window_s": 5})
        archived = await admin(client, "DELETE", sku)
        assert INSTANT.fullmatch(archived["archived_at"]), archived
        got = await sheet(client, sku)
        assert got["status"] == "archived" and got["archived_at"] == archived["archived_at"]
        assert got["payment_window_s"] == 5 and got["stock"] == 2
        resp = await client.get(
            "/admin/skus",
            params={"status": "archived", "after": f"{sku[:-1]}"},
            headers=ADMIN_HEADERS,
        )
        listed = [s for s in (await resp.json())["skus"] if s["sku"] == sku]
        assert listed and listed[0]["archived_at"] == archived["archived_at"], listed


class TestArchivedPendingOrders:
    """Orders pending payment when their sku is archived (docs/api.md says what
    becomes of them)."""

    async def test_they_may_still_be_paid_and_expire_without_a_room_warning(
        self, start_gateway: Any, sku: str
    ) -> None:
        """Archived with two orders pending: one is paid as before; the other
        expires at its deadline, its unit back in the sku's stock, and the
        expiry logs no ``room_turns_kept`` (the sku has no room, and an archived
        one's line is closed anyway)."""
        client = await start(start_gateway)
        await admin(client, "PUT", sku, {"stock": 2, "payment_window_s": 2})
        assert (await buy(client, sku, "u0", "r0"))[0] == 201
        assert (await buy(client, sku, "u1", "r1"))[0] == 201
        with capture_logs(processors=[merge_contextvars]) as logs:
            await admin(client, "DELETE", sku)
            assert (await pay(client, sku, "r0", f"{sku}-pay-0"))[0] == 200

            async def expired() -> bool:
                return await status_of(client, sku, "r1", "u1") == "expired"

            await wait_for(expired, within=30, what="the unpaid order expired")

            async def returned() -> dict[str, Any] | None:
                got = await sheet(client, sku)
                return got if got["held"] == 0 and got["db_stock"] == 1 else None

            got = await wait_for(returned, within=30, what="its unit back in stock")
        assert (got["status"], got["paid"], got["sold"]) == ("archived", 1, 1)
        kept = [e for e in logs if e["event"] == "room_turns_kept"]
        assert kept == []
