"""Limit groups (issue 41): one buyer limit across a group of skus, on every
strategy, tested the way a bot would buy: one purchase to every size at once.

Each test runs an in-process gateway on real Redis and PostgreSQL; the books
are read from PostgreSQL, which is the floor.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from gateway.domain.model import Strategy
from gateway.redis.layout import SkuKeys
from testkit.limit_groups import bot_storm, live_units, put_group, put_grouped
from testkit.polling import wait_for
from testkit.purchases import Client, admin, buy

StartGateway = Callable[..., Awaitable[Client]]


@pytest.mark.parametrize("strategy", [s for s in Strategy if s.reserves])
async def test_a_bot_buying_every_size_gets_one_pair(
    start_gateway: StartGateway, database_url: str, make_settings: Any, strategy: Strategy
) -> None:
    """On the strategies that reserve in Redis: a group of 5 skus of 40 units,
    limit 1; 400 buyers each send one purchase to every sku at once (2,000
    requests): no buyer ends with more than one unit across the group, exactly
    200 units are sold, and the audit is clean (the strategies deciding in
    PostgreSQL alone: test_limit_groups_sql.py, so that two workers share them)."""
    await bot_storm(start_gateway, database_url, make_settings(), strategy)


@pytest.mark.parametrize("strategy", [Strategy.RESERVE_BATCH, Strategy.SQL_DIRECT])
async def test_a_limit_of_two_counts_units_not_orders(
    start_gateway: StartGateway, strategy: Strategy
) -> None:
    """With a group limit of 2, qty 2 of one sku takes the whole limit (another
    sku is 409 group_limit_reached, naming the group); one unit of each of two
    skus does too; a replay of an accepted purchase answers as first answered;
    the sku's own per_user_limit still applies inside the group."""
    client = await start_gateway(strategy=strategy.value)
    group = f"g{uuid.uuid4().hex[:8]}"
    await put_group(client, group, 2)
    a, b, c = (f"{group}-{n}" for n in "abc")
    for sku in (a, b):
        await put_grouped(client, sku, group, strategy, 10, per_user_limit=2)
    await put_grouped(client, c, group, strategy, 10)
    assert (await buy(client, a, "u1", "r1", qty=2))[0] == 201
    assert await buy(client, b, "u1", "r2") == (
        409,
        {"status": "group_limit_reached", "limit_group": group},
    )
    replay = await buy(client, a, "u1", "r1", qty=2)
    assert replay[0] == 201 and replay[1]["qty"] == 2, replay
    assert (await buy(client, a, "u2", "r3"))[0] == 201
    assert (await buy(client, b, "u2", "r4"))[0] == 201
    assert (await buy(client, c, "u2", "r5"))[1] == {
        "status": "group_limit_reached",
        "limit_group": group,
    }
    status, body = await buy(client, c, "u3", "r6", qty=2)
    assert (status, body["error"]) == (400, "invalid_request"), body


@pytest.mark.parametrize("strategy", [Strategy.RESERVE_BATCH, Strategy.SQL_DIRECT])
async def test_an_expired_order_gives_its_quota_back(
    start_gateway: StartGateway, strategy: Strategy
) -> None:
    """A buyer whose pending order of one size expires may buy another size:
    the expiry returns the units to the group quota with the stock."""
    client = await start_gateway(
        strategy=strategy.value, expiry_sweep_s=0.05, payment_token="test-payment-token"
    )
    group = f"g{uuid.uuid4().hex[:8]}"
    await put_group(client, group, 1)
    a, b = f"{group}-a", f"{group}-b"
    await put_grouped(client, a, group, strategy, 5, payment_window_s=1)
    await put_grouped(client, b, group, strategy, 5, payment_window_s=1)
    assert (await buy(client, a, "u1", "r1"))[0] == 201
    assert (await buy(client, b, "u1", "r2"))[1]["status"] == "group_limit_reached"

    async def expired() -> bool:
        resp = await client.get(f"/v1/orders/{a}.r1", params={"user_id": "u1"})
        return bool((await resp.json())["status"] == "expired")

    await wait_for(expired, within=10, what="the order expired")

    async def bought_another_size() -> bool:
        status, _ = await buy(client, b, "u1", f"r3-{uuid.uuid4().hex[:6]}")
        return status == 201

    await wait_for(bought_another_size, within=10, what="another size bought")


@pytest.mark.parametrize("loss", ["records", "flush"])
async def test_the_floor_refuses_what_redis_lost(
    start_gateway: StartGateway, redis: Any, key_prefix: str, database_url: str, loss: str
) -> None:
    """Redis lost the group's records of a buyer's order: its buyers and done
    hashes alone (the counters kept, so nothing is rebuilt), or every key of
    the sale (flushed mid-sale: the other size's counter is reloaded from
    PostgreSQL, and the first size's hashes are not rebuilt, nobody buys it).
    Redis lets the buyer reserve another size; PostgreSQL's floor refuses it,
    answered 409 group_limit_reached, never 201; the unit goes back on sale."""
    client = await start_gateway(strategy=Strategy.RESERVE_BATCH.value)
    group = f"g{uuid.uuid4().hex[:8]}"
    await put_group(client, group, 1)
    a, b = f"{group}-a", f"{group}-b"
    await put_grouped(client, a, group, Strategy.RESERVE_BATCH, 5)
    await put_grouped(client, b, group, Strategy.RESERVE_BATCH, 5)
    assert (await buy(client, a, "u1", "r1"))[0] == 201
    lost = SkuKeys.of(key_prefix, a, group)
    if loss == "records":
        await redis.delete(lost.buyers, lost.done)
    else:
        async for key in redis.scan_iter(match=f"{key_prefix}*", count=1000):
            await redis.delete(key)
    assert await buy(client, b, "u1", "r2") == (
        409,
        {"status": "group_limit_reached", "limit_group": group},
    )
    assert await live_units(database_url, [a, b]) == {"u1": 1}
    kept = SkuKeys.of(key_prefix, b, group)

    async def given_back() -> bool:
        return await redis.get(kept.stock) == b"5" and not await redis.hlen(kept.pending)

    await wait_for(given_back, within=5, what="the refused unit given back")
    assert (await buy(client, b, "u2", "r3"))[0] == 201


async def test_the_floor_in_sql(con: asyncpg.Connection) -> None:
    """flush_batch() answers L for a purchase past the group's limit (naming the
    group) and grants the rest; an order inserted past it by any statement is
    refused by the insert trigger (FS003); a cancel gives the units back."""
    group = f"g{uuid.uuid4().hex[:8]}"
    a, b = f"{group}-a", f"{group}-b"
    await con.execute("INSERT INTO limit_groups VALUES ($1, 1)", group)
    for sku in (a, b):
        await con.execute(
            "INSERT INTO inventory (sku, stock, limit_group) VALUES ($1, 5, $2)", sku, group
        )
    rows = await con.fetch(
        "SELECT request_id, verdict, order_status FROM flush_batch($1, $2, $3, $4, $5, NULL, 2)",
        a,
        [f"{a}.1", f"{a}.2"],
        ["u1", "u2"],
        [1, 1],
        [0, 0],
    )
    assert {r["request_id"]: r["verdict"] for r in rows} == {f"{a}.1": "C", f"{a}.2": "C"}
    rows = await con.fetch(
        "SELECT request_id, verdict, order_status FROM flush_batch($1, $2, $3, $4, $5, NULL, 2)",
        b,
        [f"{b}.1", f"{b}.3"],
        ["u1", "u3"],
        [1, 1],
        [0, 0],
    )
    assert {r["request_id"]: (r["verdict"], r["order_status"]) for r in rows} == {
        f"{b}.1": ("L", group),
        f"{b}.3": ("C", "confirmed"),
    }
    assert await con.fetchval("SELECT stock FROM inventory WHERE sku = $1", b) == 4
    with pytest.raises(asyncpg.PostgresError) as refused:
        await con.execute(
            "INSERT INTO orders (request_id, sku, user_id, qty) VALUES ($1, $2, 'u2', 1)",
            f"{b}.2",
            b,
        )
    assert refused.value.sqlstate == "FS003"
    await con.execute("UPDATE orders SET status = 'cancelled' WHERE request_id = $1", f"{a}.1")
    held = "SELECT units FROM group_holdings WHERE limit_group = $1 AND user_id = $2"
    assert await con.fetchval(held, group, "u1") == 0
    await con.execute(
        "INSERT INTO orders (request_id, sku, user_id, qty) VALUES ($1, $2, 'u1', 1)", f"{b}.4", b
    )
    assert await con.fetchval(held, group, "u1") == 1


async def test_groups_through_the_admin_api(start_gateway: StartGateway) -> None:
    """PUT, GET and DELETE a group (409 group_in_use while a sku names it); a
    sku naming an unknown group is 422 unknown_limit_group; GET /admin/skus and
    GET /v1/skus show the sku's group; null leaves it."""
    client = await start_gateway()
    group = f"g{uuid.uuid4().hex[:8]}"
    path = f"/admin/limit-groups/{group}"
    assert await admin(client, "GET", path, None) == (
        404,
        {"error": "unknown_limit_group", "detail": f"no limit group {group!r}"},
    )
    assert await put_group(client, group, 3) == {"group": group, "per_user_limit": 3, "skus": []}
    status, body = await admin(client, "PUT", path, {"per_user_limit": 1001})
    assert (status, body["error"]) == (400, "invalid_request")
    sku = f"{group}-a"
    status, body = await admin(
        client, "PUT", f"/admin/skus/{sku}", {"stock": 1, "limit_group": "nope"}
    )
    assert (status, body["error"]) == (422, "unknown_limit_group"), body
    await put_grouped(client, sku, group, Strategy.RESERVE_BATCH, 2)
    assert await admin(client, "GET", path, None) == (
        200,
        {"group": group, "per_user_limit": 3, "skus": [sku]},
    )
    status, body = await admin(
        client, "PATCH", f"/admin/skus/{sku}", {"stock": 3, "limit_group": None}
    )
    assert (status, body["limit_group"]) == (200, group), body
    status, body = await admin(client, "GET", f"/admin/skus/{sku}", None)
    assert (status, body["limit_group"]) == (200, group), body
    resp = await client.get(f"/v1/skus/{sku}")
    assert (await resp.json())["limit_group"] == group
    status, body = await admin(client, "DELETE", path, None)
    assert (status, body["error"]) == (409, "group_in_use")
    status, body = await admin(client, "PATCH", f"/admin/skus/{sku}", {"limit_group": ""})
    assert status == 200 and "limit_group" not in body, body
    assert await admin(client, "DELETE", path, None) == (200, {"group": group, "deleted": True})


async def test_a_sku_changes_group_only_while_nothing_is_held(start_gateway: StartGateway) -> None:
    """A sku with no order moves to another group (its Redis state starts again
    in the new group's slot, and it sells there); once it has a live order its
    group is 409 limit_group_locked, nothing changed; a sku of each group then
    counts for its own group alone."""
    client = await start_gateway()
    first, second = (f"g{uuid.uuid4().hex[:8]}" for _ in range(2))
    await put_group(client, first, 1)
    await put_group(client, second, 1)
    a, b = f"{first}-a", f"{first}-b"
    await put_grouped(client, a, first, Strategy.RESERVE_BATCH, 5)
    await put_grouped(client, b, first, Strategy.RESERVE_BATCH, 5)
    status, body = await admin(client, "PATCH", f"/admin/skus/{b}", {"limit_group": second})
    assert (status, body["limit_group"], body["redis_stock"]) == (200, second, 5), body
    assert (await buy(client, a, "u1", "r1"))[0] == 201
    assert (await buy(client, b, "u1", "r2"))[0] == 201
    status, body = await admin(client, "PATCH", f"/admin/skus/{b}", {"limit_group": first})
    assert (status, body["error"]) == (409, "limit_group_locked"), body
    assert await admin(client, "GET", f"/admin/limit-groups/{second}", None) == (
        200,
        {"group": second, "per_user_limit": 1, "skus": [b]},
    )
