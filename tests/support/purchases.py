"""Purchases and sku set-up through an in-process gateway's HTTP test client, and
the state they leave in PostgreSQL and Redis."""

from __future__ import annotations

from typing import Any

import asyncpg
from aiohttp import web
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from gateway.layout import SkuKeys
from tests.support.metrics import metric, samples
from tests.support.polling import wait_for

Client = TestClient[web.Request, web.Application]

ADMIN_TOKEN = "test-admin-token"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def put_sku(
    client: Client, sku: str, stock: int, limit: int = 1, strategy: str | None = None
) -> None:
    """Create or reset a sku through the admin API (asserts a 200); with ``strategy``
    the sku sells under that strategy instead of the gateway's."""
    body: dict[str, Any] = {"stock": stock, "per_user_limit": limit}
    if strategy is not None:
        body["strategy"] = strategy
    resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
    assert resp.status == 200, await resp.text()


async def buy(
    client: Client, sku: str, user: str, rid: str | None = None, qty: int = 1
) -> tuple[int, dict[str, Any]]:
    """``POST /v1/purchase``; returns (status, JSON body).

    ``rid`` becomes the request id ``<sku>.<rid>``: request ids are unique
    across skus, and the sku keeps tests apart.
    """
    body: dict[str, Any] = {"sku": sku, "user_id": user, "qty": qty}
    if rid is not None:
        body["request_id"] = f"{sku}.{rid}"
    resp = await client.post("/v1/purchase", json=body)
    return resp.status, await resp.json()


async def db_state(database_url: str, sku: str) -> tuple[int, int, int]:
    """(stock, orders, distinct users) of a sku in PostgreSQL."""
    con = await asyncpg.connect(database_url)
    try:
        stock = await con.fetchval("SELECT stock FROM inventory WHERE sku = $1", sku)
        row = await con.fetchrow(
            "SELECT count(*) AS n, count(DISTINCT user_id) AS users FROM orders WHERE sku = $1", sku
        )
        assert row is not None  # an aggregate always returns one row
        return stock, row["n"], row["users"]
    finally:
        await con.close()


async def redis_state(redis: Redis, prefix: str, sku: str) -> tuple[int | None, int]:
    """(stock, pending ledger size) of a sku in Redis."""
    keys = SkuKeys.of(prefix, sku)
    raw = await redis.get(keys.stock)
    return (None if raw is None else int(raw)), await redis.hlen(keys.pending)


async def client_metric(client: Client, name: str) -> float:
    """One metric of an in-process gateway (``GET /metrics``), summed over its labels."""
    return metric(samples(await (await client.get("/metrics")).text()), name)


async def wait_sold_out_marked(client: Client, builds: int = 1) -> None:
    """Wait until the gateway has built ``builds`` sold-out replay filters: it builds
    them in the background, after answering the request that found the sku sold out."""

    async def built() -> bool:
        return await client_metric(client, "flashsale_confirmed_id_builds_total") >= builds

    await wait_for(built, what=f"{builds} sold-out filter(s) built")
