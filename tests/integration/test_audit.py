"""The stock audit on real Redis and PostgreSQL: a healthy sale passes, planted
corruption fails with the right verdict and exit code, in-process and as the
``flashsale-gateway audit`` command."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from gateway.ops.audit import Finding, SkuAudit, audit, render
from gateway.redis.layout import SkuKeys
from gateway.settings import Settings
from testkit.commands import run_audit
from testkit.purchases import ADMIN_HEADERS, buy, put_sku
from testkit.services import execute as sql


@pytest.fixture
async def tampered(database_url: str, sku: str) -> AsyncIterator[str]:
    """The test's sku, removed from the session database afterwards, so planted
    corruption never reaches another test's audit of every sku."""
    yield sku
    con = await asyncpg.connect(database_url)
    try:
        async with con.transaction():
            for table in ("orders", "stock_movements", "inventory"):
                await con.execute(f"DELETE FROM {table} WHERE sku = $1", sku)
    finally:
        await con.close()


async def healthy_sale(client: Any, sku: str) -> None:
    """Set 5, sell 3, restock 2, reset to 3, sell 1: 2 left, 4 sold, 6 provided."""
    await put_sku(client, sku, 5)
    for user in ("a", "b", "c"):
        assert (await buy(client, sku, user))[0] == 201
    resp = await client.post(f"/admin/skus/{sku}/restock", json={"delta": 2}, headers=ADMIN_HEADERS)
    assert resp.status == 200, await resp.text()
    await put_sku(client, sku, 3)
    assert (await buy(client, sku, "d"))[0] == 201


class TestHealthySale:
    """Books kept by the gateway itself balance, whatever the admin did."""

    async def test_sale_with_restock_and_reset_is_ok(
        self, start_gateway: Any, make_settings: Callable[..., Settings], sku: str
    ) -> None:
        """After purchases, a restock and a reset the row balances: provided is
        the sum of movements (5 + 2 + (3 - 4)), db stock = provided - sold, Redis
        agrees, and the command exits 0 printing the row as ok."""
        client = await start_gateway()
        await healthy_sale(client, sku)
        settings = make_settings()

        assert await audit(settings, sku) == [
            SkuAudit(
                sku=sku,
                provided=6,
                db_stock=2,
                orders=4,
                sold=4,
                users=4,
                duplicate_users=0,
                redis_stock=2,
                pending=0,
            )
        ]
        code, out, err = await run_audit(settings, "--sku", sku)
        assert (code, err) == (0, "")
        header, row = out.splitlines()
        assert header.split() == [
            "sku",
            "provided",
            "db_stock",
            "orders",
            "sold",
            "held",
            "users",
            "redis_stock",
            "pending",
            "drift",
            "verdict",
        ]
        assert row.split() == [sku, "6", "2", "4", "4", "0", "4", "2", "0", "0", "ok"]

    async def test_every_sku_is_audited_without_sku(
        self, start_gateway: Any, make_settings: Callable[..., Settings], sku: str
    ) -> None:
        """Without a sku every inventory row is audited, in sku order."""
        client = await start_gateway()
        await put_sku(client, f"{sku}-2", 1)
        await put_sku(client, f"{sku}-1", 1)
        rows = await audit(make_settings())
        skus = [row.sku for row in rows]
        assert skus == sorted(skus)
        assert {f"{sku}-1", f"{sku}-2"} <= set(skus)

    async def test_missing_redis_stock_is_no_drift(
        self,
        start_gateway: Any,
        make_settings: Callable[..., Settings],
        sku: str,
        redis: Redis,
        key_prefix: str,
    ) -> None:
        """With the stock key gone (it reloads on demand) Redis stock and drift
        show '-' and the row stays ok."""
        client = await start_gateway()
        await put_sku(client, sku, 3)
        await redis.delete(SkuKeys.of(key_prefix, sku).stock)
        [row] = await audit(make_settings(), sku)
        assert (row.redis_stock, row.drift, row.verdict) == (None, None, Finding.OK)
        assert render([row]).splitlines()[1].split()[7:] == ["-", "0", "-", "ok"]


class TestCorruptedBooks:
    """Orders or stock changed behind the gateway's back fail the audit."""

    async def test_orders_planted_by_hand_are_an_oversell(
        self,
        start_gateway: Any,
        make_settings: Callable[..., Settings],
        tampered: str,
        database_url: str,
    ) -> None:
        """Four orders inserted by hand on a sku of 3 with 2 sold: 6 sold of 3
        provided is OVERSOLD and UNBALANCED, and the command exits 1."""
        sku = tampered
        client = await start_gateway()
        await put_sku(client, sku, 3)
        for user in ("a", "b"):
            assert (await buy(client, sku, user))[0] == 201
        for n in range(4):
            await sql(
                database_url,
                "INSERT INTO orders (request_id, sku, user_id, qty) VALUES ($1, $2, $3, 1)",
                f"planted-{uuid.uuid4().hex}",
                sku,
                f"ghost{n}",
            )
        settings = make_settings()

        [row] = await audit(settings, sku)
        assert (row.provided, row.sold, row.db_stock, row.drift) == (3, 6, 1, 0)
        assert row.findings == (Finding.OVERSOLD, Finding.UNBALANCED)
        assert row.failed
        code, out, _ = await run_audit(settings, "--sku", sku)
        assert code == 1
        assert out.splitlines()[1].split()[-1] == "OVERSOLD,UNBALANCED"

    async def test_stock_raised_by_hand_is_unbalanced(
        self,
        start_gateway: Any,
        make_settings: Callable[..., Settings],
        tampered: str,
        database_url: str,
    ) -> None:
        """Stock raised with a bare UPDATE (no movement) is UNBALANCED, and
        DRIFT since Redis never heard of it; not an oversell. Exit 1."""
        sku = tampered
        client = await start_gateway()
        await put_sku(client, sku, 3)
        assert (await buy(client, sku, "a"))[0] == 201
        await sql(database_url, "UPDATE inventory SET stock = stock + 5 WHERE sku = $1", sku)
        settings = make_settings()

        [row] = await audit(settings, sku)
        assert (row.provided, row.sold, row.db_stock, row.drift) == (3, 1, 7, 5)
        assert row.findings == (Finding.UNBALANCED, Finding.DRIFT)
        assert (await run_audit(settings, "--sku", sku))[0] == 1

    async def test_negative_redis_stock_fails(
        self,
        start_gateway: Any,
        make_settings: Callable[..., Settings],
        sku: str,
        redis: Redis,
        key_prefix: str,
    ) -> None:
        """A Redis stock below zero is NEGATIVE_STOCK, a failure (exit 1)."""
        client = await start_gateway()
        await put_sku(client, sku, 3)
        await redis.set(SkuKeys.of(key_prefix, sku).stock, -2)
        settings = make_settings()
        [row] = await audit(settings, sku)
        assert row.findings == (Finding.NEGATIVE_STOCK, Finding.DRIFT)
        assert (await run_audit(settings, "--sku", sku))[0] == 1

    async def test_drift_alone_is_a_warning(
        self,
        start_gateway: Any,
        make_settings: Callable[..., Settings],
        sku: str,
        redis: Redis,
        key_prefix: str,
    ) -> None:
        """A ledger entry the database does not account for counts as pending and
        makes drift negative: DRIFT is printed, yet the command exits 0."""
        client = await start_gateway()
        await put_sku(client, sku, 3)
        await redis.hset(SkuKeys.of(key_prefix, sku).pending, "stray", "ghost|2|0")
        settings = make_settings()
        [row] = await audit(settings, sku)
        assert (row.redis_stock, row.pending, row.drift) == (3, 2, -2)
        assert (row.findings, row.failed) == ((Finding.DRIFT,), False)
        code, out, _ = await run_audit(settings, "--sku", sku)
        assert code == 0
        assert out.splitlines()[1].split()[-2:] == ["-2", "DRIFT"]
