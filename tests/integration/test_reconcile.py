"""Reconciliation, metrics and logs of a running gateway (in-process)."""

from __future__ import annotations

import time
from typing import Any

import asyncpg
from redis.asyncio import Redis
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from gateway.domain.model import Purchase, SkuInfo
from gateway.domain.stock import Pending, ReplyKind
from gateway.http.appkeys import BATCHER, ORDERS, RESERVATIONS, SETTINGS
from gateway.redis.layout import SkuKeys, encode_pending
from testkit.metrics import samples
from testkit.purchases import ADMIN_HEADERS, buy, counts, put_sku, redis_state

LONG_AGO_MS = 1_000


def key_prefix_of(client: Any) -> str:
    """The key prefix of the gateway behind ``client``."""
    prefix: str = client.app[SETTINGS].key_prefix
    return prefix


async def crash_leftovers(client: Any, sku: str, database_url: str) -> None:
    """What a gateway killed mid-flush leaves: two old reservations in the ledger,
    one whose order committed ("ghost-a") and one that never reached PostgreSQL."""
    reservations = client.app[RESERVATIONS]
    for user in ("a", "b"):
        rid = f"{sku}.ghost-{user}"
        reply = await reservations.reserve(Purchase(sku, user, 1, rid), SkuInfo(sku, 1))
        assert reply.kind is ReplyKind.OK
        # reserve.lua stamps with Redis's clock: backdate the ledger entry.
        old = encode_pending(Pending(rid, user, 1, LONG_AGO_MS))
        await reservations.redis.hset(SkuKeys.of(key_prefix_of(client), sku).pending, rid, old)
    con = await asyncpg.connect(database_url)
    try:
        async with con.transaction():
            await con.execute(
                "INSERT INTO orders (request_id, sku, user_id, qty) VALUES ($1, $2, 'a', 1)",
                f"{sku}.ghost-a",
                sku,
            )
            await con.execute(
                "UPDATE inventory SET stock = stock - 1 WHERE sku = $1 AND stock >= 1", sku
            )
    finally:
        await con.close()


class TestReconciliation:
    """A crash between reservation and commit loses nothing."""

    async def test_stale_reservations_are_confirmed_or_given_back(
        self, start_gateway: Any, sku: str, database_url: str, redis: Redis, key_prefix: str
    ) -> None:
        """Before reconciliation the killed requests are in_progress; after it the
        committed one is confirmed with its order and the other's stock is back,
        so its retry buys for real."""
        client = await start_gateway(reconcile_interval_s=3600)
        await put_sku(client, sku, 10)
        await crash_leftovers(client, sku, database_url)
        resp = await client.post(
            "/v1/purchase", json={"sku": sku, "user_id": "b", "request_id": f"{sku}.ghost-b"}
        )
        assert (resp.status, await resp.json()) == (409, {"status": "in_progress"})
        assert resp.headers["Retry-After"]

        resp = await client.post("/admin/reconcile", headers=ADMIN_HEADERS)
        assert resp.status == 200
        assert (await resp.json())[sku] == {
            "confirmed": 1,
            "released": 1,
            "pending": 0,
            "drift": 0,
            "repaired": False,
        }
        assert await redis_state(redis, key_prefix, sku) == (9, 0)
        status, body = await buy(client, sku, "a", "ghost-a")
        assert (status, body["status"]) == (201, "confirmed")
        status, body = await buy(client, sku, "b", "ghost-b")
        assert (status, body["status"]) == (201, "confirmed")
        report = await (await client.get(f"/admin/skus/{sku}", headers=ADMIN_HEADERS)).json()
        assert counts(report) == {"db_stock": 8, "redis_stock": 8, "pending": 0, "sold": 2}

    async def test_unexplained_drift_is_repaired_from_the_database(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """Redis stock changed by hand is reported as drift and set back."""
        client = await start_gateway(reconcile_interval_s=3600)
        await put_sku(client, sku, 10)
        await redis.set(SkuKeys.of(key_prefix, sku).stock, 13)
        result = await (await client.post("/admin/reconcile", headers=ADMIN_HEADERS)).json()
        assert result[sku]["drift"] == -3 and result[sku]["repaired"] is True
        assert await redis_state(redis, key_prefix, sku) == (10, 0)
        result = await (await client.post("/admin/reconcile", headers=ADMIN_HEADERS)).json()
        assert result[sku]["drift"] == 0 and result[sku]["repaired"] is False

    async def test_fresh_reservations_are_left_alone(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """A reservation younger than the timeout is in flight, not drift."""
        client = await start_gateway(reconcile_interval_s=3600)
        await put_sku(client, sku, 5)
        reservations = client.app[RESERVATIONS]
        await reservations.reserve(Purchase(sku, "z", 1, "fresh"), SkuInfo(sku, 1))
        result = await (await client.post("/admin/reconcile", headers=ADMIN_HEADERS)).json()
        assert result[sku] == {
            "confirmed": 0,
            "released": 0,
            "pending": 1,
            "drift": 0,
            "repaired": False,
        }
        assert await redis_state(redis, key_prefix, sku) == (4, 1)

    async def test_background_reconciler_runs_on_its_own(
        self, start_gateway: Any, sku: str, database_url: str, redis: Redis, key_prefix: str
    ) -> None:
        """With a short interval the leftovers are settled without being asked."""
        client = await start_gateway(reconcile_interval_s=0.05)
        await put_sku(client, sku, 10)
        await crash_leftovers(client, sku, database_url)
        deadline = time.monotonic() + 10
        while await redis_state(redis, key_prefix, sku) != (9, 0):
            assert time.monotonic() < deadline, await redis_state(redis, key_prefix, sku)
            await client.app[ORDERS].ping()  # yields to the loop


class TestMetrics:
    """/metrics shows the health signals with the right labels."""

    async def test_after_a_small_sale(self, start_gateway: Any, sku: str) -> None:
        """3 confirmed, 2 sold out, 1 invalid: counted by outcome, timed by route,
        batches and lock waits observed."""
        client = await start_gateway()
        await put_sku(client, sku, 3)
        for i in range(5):
            await buy(client, sku, f"m{i}")
        await client.post("/v1/purchase", data=b"{")
        resp = await client.get("/metrics")
        assert resp.status == 200
        assert resp.content_type == "text/plain"
        found = samples(await resp.text())

        def outcome(name: str) -> float:
            return found[f'flashsale_purchases_total{{outcome="{name}"}}']

        assert (outcome("confirmed"), outcome("sold_out"), outcome("invalid")) == (3, 2, 1)
        route = 'outcome="confirmed",route="/v1/purchase"'  # labels as written: sorted
        assert found[f"flashsale_request_duration_seconds_count{{{route}}}"] == 3
        assert found["flashsale_batch_size_count"] >= 1
        assert found["flashsale_batch_size_sum"] == 3
        assert "flashsale_queue_depth" in found
        assert "flashsale_locks_lost_total" in found

    async def test_metrics_can_be_switched_off(self, start_gateway: Any) -> None:
        """With GATEWAY_METRICS=false there is no /metrics route."""
        client = await start_gateway(metrics=False)
        assert (await client.get("/metrics")).status == 404


class TestLogs:
    """Warnings carry the request id and sku bound for the request."""

    async def test_failure_warning_has_request_id(self, start_gateway: Any, sku: str) -> None:
        """A purchase refused with 503 logs one warning naming its request id and sku."""
        client = await start_gateway()
        await put_sku(client, sku, 3)
        await client.app[BATCHER].close()
        with capture_logs(processors=[merge_contextvars]) as logs:
            resp = await client.post(
                "/v1/purchase", json={"sku": sku, "user_id": "l", "request_id": f"{sku}.log-1"}
            )
        assert resp.status == 503
        failures = [e for e in logs if e["event"] == "request_failed"]
        assert len(failures) == 1
        assert failures[0]["log_level"] == "warning"
        assert (failures[0]["request_id"], failures[0]["sku"]) == (f"{sku}.log-1", sku)
