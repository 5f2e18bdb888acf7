"""Purchases and sku set-up through an in-process gateway's HTTP test client, and
the state they leave in PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from typing import Any

import asyncpg
from aiohttp import web
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from gateway.redis.layout import SkuKeys
from testkit.metrics import metric, samples
from testkit.polling import wait_for

Client = TestClient[web.Request, web.Application]

ADMIN_TOKEN = "test-admin-token"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def put_sku(
    client: Client,
    sku: str,
    stock: int,
    limit: int = 1,
    strategy: str | None = None,
    **fields: Any,
) -> None:
    """Create or reset a sku through the admin API (asserts a 200); with ``strategy``
    the sku sells under that strategy instead of the gateway's; ``fields`` are
    any other of the PUT's fields (``starts_at``, ``waiting_room`` ...)."""
    body: dict[str, Any] = {"stock": stock, "per_user_limit": limit, **fields}
    if strategy is not None:
        body["strategy"] = strategy
    resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
    assert resp.status == 200, await resp.text()


async def admin(
    client: Client, method: str, path: str, body: Any, token: str = ADMIN_TOKEN
) -> tuple[int, Any]:
    """One admin request; (status, JSON body)."""
    headers = {"Authorization": f"Bearer {token}"}
    resp = await client.request(method, path, json=body, headers=headers)
    return resp.status, await resp.json()


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


async def look_up(
    client: Client, request_id: str, user: str | None, wait: float | None = None
) -> tuple[int, dict[str, Any]]:
    """``GET /v1/orders/{request_id}?user_id=<user>[&wait=]`` (no user_id when
    ``user`` is None); returns (status, JSON body)."""
    params = {} if user is None else {"user_id": user}
    if wait is not None:
        params["wait"] = str(wait)
    resp = await client.get(f"/v1/orders/{request_id}", params=params)
    return resp.status, await resp.json()


async def answer_of(client: Client, target: str) -> tuple[int, bytes, tuple[tuple[str, str], ...]]:
    """All a GET of ``target`` answers but its Date: status, body and the other
    headers, to compare two answers byte for byte."""
    resp = await client.get(target)
    headers = tuple((k, v) for k, v in resp.headers.items() if k != "Date")
    return resp.status, await resp.read(), headers


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


async def orders_of(database_url: str, sku: str) -> int:
    """Order rows of ``sku`` in PostgreSQL."""
    con = await asyncpg.connect(database_url)
    try:
        n: int = await con.fetchval("SELECT count(*) FROM orders WHERE sku = $1", sku)
        return n
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


async def wait_sold_out_marked(client: Client, sku: str) -> None:
    """Wait until the gateway has built ``sku``'s sold-out replay filter (the
    first of this gateway's): it builds it in the background, after answering a
    purchase that found the sku exhausted in Redis, no stock and no reservation
    pending. A 201 goes out before its batch is settled in Redis, so a refusal
    right after it can still find that reservation pending, which marks nothing
    (a loaded fresh-clone run waited 5 s for a build that never came): while
    none is built, one more purchase of a new buyer is refused every 0.3 s."""
    late = itertools.count()
    asked_at = time.monotonic()

    async def built() -> bool:
        nonlocal asked_at
        if await client_metric(client, "flashsale_confirmed_id_builds_total") >= 1:
            return True
        if time.monotonic() - asked_at >= 0.3:
            asked_at = time.monotonic()
            status, body = await buy(client, sku, f"marking-{next(late)}")
            assert status == 409, body
        return False

    await wait_for(built, what=f"the sold-out filter of {sku} built")


# How often a client resends a purchase answered 503 (same request id) in a storm.
RESENDS = 20


async def buy_resending(
    client: Client, sku: str, user: str, rid: str, qty: int = 1
) -> tuple[int, dict[str, Any]]:
    """Buy, resending with the same request id while the answer is 503, as a
    client honouring Retry-After does (bounded)."""
    for _ in range(RESENDS):
        status, body = await buy(client, sku, user, rid, qty)
        if status != 503:
            break
    return status, body


async def sku_json(client: Client, sku: str) -> dict[str, Any]:
    """``GET /v1/skus/{sku}`` (asserts a 200)."""
    resp = await client.get(f"/v1/skus/{sku}")
    assert resp.status == 200, await resp.text()
    data: dict[str, Any] = await resp.json()
    return data


async def storm(client: Client, sku: str, users: int) -> collections.Counter[str]:
    """Each of ``users`` buyers clicks twice at once (two request ids); the count of
    final answers by status, after asserting no buyer got two orders."""
    calls = [
        buy_resending(client, sku, f"u{i}", f"r{i}-{n}") for n in range(2) for i in range(users)
    ]
    results = await asyncio.gather(*calls)
    confirmed = [b["user_id"] for s, b in results if s == 201]
    assert len(confirmed) == len(set(confirmed)), "a buyer got two orders"
    return collections.Counter(str(b.get("status", b.get("error"))) for _, b in results)


async def put_rules(client: Any, sku: str, stock: int, **rules: Any) -> dict[str, Any]:
    """PUT the sku with ``rules`` (starts_at, ends_at, user_rate, client_rate); asserts 200."""
    resp = await client.put(
        f"/admin/skus/{sku}", json={"stock": stock, **rules}, headers=ADMIN_HEADERS
    )
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


# The counts of GET /admin/skus/{sku}, beside the settings it also answers.
COUNTS = ("db_stock", "redis_stock", "pending", "sold")


def counts(report: dict[str, Any]) -> dict[str, Any]:
    """The counts of a ``GET /admin/skus/{sku}`` answer alone."""
    return {name: report[name] for name in COUNTS}
