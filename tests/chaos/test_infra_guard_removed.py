"""The chaos checks can fail: with the database guard gone, the invariants and
the audit both report the oversell."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from gateway.ops.audit import Finding, audit
from gateway.postgres.database import migrate
from gateway.settings import Settings
from testkit.driver import (
    CONFIRMED,
    ClientRecord,
    DriverSummary,
)
from testkit.invariants import check_invariants
from testkit.postgres_servers import PostgresCluster
from testkit.redis_servers import RedisServer
from tests.chaos.reporting import REPORT_LINES

# --------------------------------------------------------------------------- the harness bites


NAIVE_BUYERS = 30
NAIVE_STOCK = 10


async def _naive_purchase(
    url: str, sku: str, user: str, everyone_looked: asyncio.Barrier
) -> ClientRecord:
    """Check-then-act with no guard: read the stock, and if some is left take one."""
    record = ClientRecord(user, f"naive-{user}", 1)
    con = await asyncpg.connect(url)
    try:
        stock = await con.fetchval("SELECT stock FROM inventory WHERE sku = $1", sku)
        await everyone_looked.wait()  # every buyer saw stock before anyone takes it
        if stock > 0:
            async with con.transaction():
                # Deliberately unguarded (test-only code; tests/ is not scanned).
                await con.execute("UPDATE inventory SET stock = stock - 1 WHERE sku = $1", sku)
                record.order_id = await con.fetchval(
                    "INSERT INTO orders (request_id, sku, user_id, qty) VALUES ($1, $2, $3, 1)"
                    " RETURNING order_id::text",
                    record.request_id,
                    sku,
                    user,
                )
            record.outcome, record.status = CONFIRMED, 201
    finally:
        await con.close()
    return record


@pytest.mark.chaos
@pytest.mark.timeout(60)
async def test_harness_catches_oversell_when_the_guard_is_gone(
    pg: PostgresCluster, redis_server: RedisServer
) -> None:
    """The checks can fail: without the guard, 30 buyers take 10 units and both the
    invariants and the audit say so.

    The gateway's own flush cannot be made to oversell from outside (its UPDATE
    carries ``stock >= $n`` in its WHERE, and its code must not change), so this
    removes the floor at the database instead: in a private database, after the
    real migrations, the CHECK (stock >= 0) constraint is dropped, and a naive,
    test-only flush (check stock, then an unguarded ``stock = stock - 1`` plus an
    order insert, 30 concurrent buyers) plays the gateway without its guard. The
    same ``check_invariants`` and ``gateway.ops.audit.audit`` the scenarios rely on
    must then report the oversell, the negative stock and a 201 without its row.
    """
    name = f"naive_{time.monotonic_ns()}"
    await pg.create_database(name)
    url = pg.url(name)
    con = await asyncpg.connect(url)
    try:
        await migrate(con)
        await con.execute("ALTER TABLE inventory DROP CONSTRAINT inventory_stock_check")
        await con.execute("INSERT INTO inventory (sku, stock) VALUES ('naive', $1)", NAIVE_STOCK)
        await con.execute(
            "INSERT INTO stock_movements (sku, delta, reason, stock_after)"
            " VALUES ('naive', $1, 'set', $1)",
            NAIVE_STOCK,
        )
    finally:
        await con.close()
    barrier = asyncio.Barrier(NAIVE_BUYERS)
    buyers = [_naive_purchase(url, "naive", f"user-{i}", barrier) for i in range(NAIVE_BUYERS)]
    async with asyncio.timeout(30):
        records = list(await asyncio.gather(*buyers))
    # A client told 201 whose row is missing: the false-confirmation check must bite.
    records.append(ClientRecord("ghost", "naive-ghost", 1, outcome=CONFIRMED, order_id="x"))
    summary = DriverSummary("naive", records, 0.0)
    report = await check_invariants(
        url, "naive", NAIVE_STOCK, summary, scenario="guard removed", faults="naive flush"
    )
    REPORT_LINES.append(report.line())
    assert report.oversell == NAIVE_BUYERS - NAIVE_STOCK, str(report)
    problems = report.problems()
    assert any(p.startswith("oversell") for p in problems), problems
    assert report.false_confirmations == ["naive-ghost"], problems
    assert not report.ok
    rows = await audit(Settings(redis_url=redis_server.url(), database_url=url), "naive")
    assert rows[0].verdict == Finding.OVERSOLD, rows
    assert Finding.NEGATIVE_STOCK in rows[0].findings, rows
    assert rows[0].failed
