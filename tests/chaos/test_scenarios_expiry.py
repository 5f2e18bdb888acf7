"""Chaos scenario 9: orders expire while a fault strikes the sweep (issue 31).

Two gateway processes sell a sku with a 1 s payment window to buyers who never
pay, their deadlines spread over a second; once the first order expired, the
fault strikes while the rest are still due: PostgreSQL restarts, or a gateway
is SIGKILLed. Whatever happened, every order ends expired, its unit back on
sale once (PostgreSQL's stock, Redis's counter, one movement each), the books
balance, and the units sell again exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import asyncpg
import pytest

from testkit.polling import wait_for
from testkit.postgres_servers import PostgresCluster
from testkit.redis_servers import redis_client
from tests.chaos.reporting import Diagnostics
from tests.chaos.sale import settings_for
from tests.chaos.stacks import Stack, proxied_stack

SKU = "expiring"
UNITS = 40
PAYMENT_TOKEN = "chaos-payment-token"
SETTINGS = settings_for("redis", payment_token=PAYMENT_TOKEN, expiry_sweep_s=0.05)


async def buy(session: aiohttp.ClientSession, url: str, user: str) -> int:
    """One purchase of one unit; its status."""
    body = {"sku": SKU, "user_id": user, "request_id": f"{SKU}.{user}"}
    async with session.post(f"{url}/v1/purchase", json=body) as resp:
        return resp.status


async def sell_unpaid(stack: Stack) -> None:
    """Sell every unit in four waves a quarter second apart, so the deadlines
    are spread over a second; nobody pays."""
    await stack.gateways.admin("PUT", f"/admin/skus/{SKU}", {"stock": UNITS, "payment_window_s": 1})
    urls = stack.live_urls()
    async with aiohttp.ClientSession() as session:
        for wave in range(4):
            users = range(wave * UNITS // 4, (wave + 1) * UNITS // 4)
            statuses = await asyncio.gather(
                *(buy(session, urls[u % len(urls)], f"u{u}") for u in users)
            )
            assert set(statuses) == {201}, statuses
            await asyncio.sleep(0.25)  # the next wave's deadlines come later


async def expired(stack: Stack) -> int:
    """Orders of the sku expired (PostgreSQL, directly)."""
    con = await asyncpg.connect(stack.database_url, timeout=2)
    try:
        count: int = await con.fetchval(
            "SELECT count(*) FROM orders WHERE sku = $1 AND status = 'expired'", SKU, timeout=2
        )
        return count
    finally:
        await con.close(timeout=2)


async def all_back_on_sale(stack: Stack) -> None:
    """Every order expired and returned once: the books balance with nothing
    held, PostgreSQL and Redis count every unit on sale, one movement each."""

    async def back() -> bool:
        row = await stack.audit(SKU)
        return (row.held, row.sold, row.db_stock, row.redis_stock) == (0, 0, UNITS, UNITS)

    await wait_for(back, within=30, what="every unit back on sale")
    row = await stack.audit(SKU)
    assert row.verdict.value == "ok", row
    con = await asyncpg.connect(stack.database_url, timeout=2)
    try:
        moved = await con.fetchval(
            "SELECT count(*) FROM stock_movements WHERE sku = $1 AND reason = 'expired'", SKU
        )
    finally:
        await con.close(timeout=2)
    assert moved == UNITS
    async with redis_client(await stack.redis_address()) as r:
        assert await r.hlen(stack.keys(SKU).returned) == UNITS


async def resold_once(stack: Stack) -> None:
    """Twice as many new buyers as units: exactly every unit is sold again."""
    urls = stack.live_urls()
    async with aiohttp.ClientSession() as session:
        statuses = await asyncio.gather(
            *(buy(session, urls[u % len(urls)], f"again{u}") for u in range(2 * UNITS))
        )
    assert statuses.count(201) == UNITS, statuses
    row = await stack.audit(SKU)
    assert (row.held, row.db_stock, row.verdict.value) == (UNITS, 0, "ok"), row


async def scenario(stack: Stack, fault: Callable[[Stack], Awaitable[Any]]) -> None:
    """Sell unpaid, strike once the first order expired, then check."""
    await sell_unpaid(stack)
    await wait_for(lambda: expired(stack), within=10, what="a first order expired")
    assert await expired(stack) < UNITS, "the fault came after the last deadline"
    await fault(stack)
    await all_back_on_sale(stack)
    await resold_once(stack)


@pytest.mark.chaos
@pytest.mark.timeout(120)
async def test_expiry_through_a_postgres_restart_mid_sweep(
    pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """PostgreSQL restarts (fast) while orders are still due: the sweeps' open
    transactions break and roll back, the sweeps retry once it is back, and
    each order is expired and returned once."""
    async with proxied_stack(pg, diagnostics, SETTINGS) as stack:

        async def restart(stack: Stack) -> None:
            await stack.pg.restart("fast")

        await scenario(stack, restart)


@pytest.mark.chaos
@pytest.mark.timeout(120)
async def test_expiry_through_a_gateway_sigkilled_mid_sweep(
    pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """A gateway is SIGKILLed while orders are still due, maybe between a
    commit and its return to Redis: the other gateway sweeps the rest and
    finishes the returns owed, each once."""
    async with proxied_stack(pg, diagnostics, SETTINGS) as stack:

        async def kill(stack: Stack) -> None:
            await stack.gateways[0].crash()

        await scenario(stack, kill)
