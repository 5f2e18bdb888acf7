"""The wrk bench's checks: units sold against the 201s wrk saw, and Redis and
PostgreSQL agreeing once the gateway settled."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import asyncpg

from loadtests.lib import wrk
from loadtests.lib.bench_paths import IN_STOCK, IN_STOCK_SKU, WRITERS
from loadtests.lib.targets import Target
from testkit.http import http
from testkit.polling import wait_for

SETTLE_TIMEOUT_S = 15.0
SOLD_SNAPSHOT = """
SELECT stock, (SELECT count(*) FROM orders WHERE sku = $1) AS orders
FROM inventory WHERE sku = $1
"""


async def _fetch_sold(database_url: str, sku: str) -> dict[str, int]:
    con = await asyncpg.connect(database_url)
    try:
        # One statement, one snapshot: a flush committing between two reads
        # would make stock and orders disagree by its size.
        row = await con.fetchrow(SOLD_SNAPSHOT, sku)
    finally:
        await con.close()
    if row is None:
        raise RuntimeError(f"sku {sku!r} vanished from {database_url}")
    return {"db_stock": int(row["stock"]), "orders": int(row["orders"])}


def wait_settled(
    gateway: Target, sku: str = IN_STOCK_SKU, deadline_s: float = SETTLE_TIMEOUT_S
) -> dict[str, Any]:
    """Poll the gateway's admin report of ``sku`` until nothing is pending (or the
    deadline); the last report seen."""
    report: dict[str, Any] = {}

    async def settled() -> bool:
        status, body = http("GET", f"{gateway.url}/admin/skus/{sku}", token=gateway.admin_token)
        report.clear()
        report.update(body if status == 200 and isinstance(body, dict) else {"status": status})
        return report.get("pending") == 0

    with contextlib.suppress(TimeoutError):
        asyncio.run(wait_for(settled, within=deadline_s, what="nothing pending", interval=0.1))
    return report


def audit(
    targets: dict[str, Target], databases: dict[str, str], runs: Sequence[wrk.WrkResult], stock: int
) -> dict[str, Any]:
    """Units sold against the 201s wrk counted, and stock conservation, per target.

    wrk stops with requests in flight, so up to ``connections`` orders per run
    may commit unseen; more than that, or fewer orders than 201s, is a bug.
    """
    found: dict[str, Any] = {}
    for name in WRITERS:
        seen = sum(r.statuses.get("201", 0) for r in runs if r.target == name)
        sold = asyncio.run(_fetch_sold(databases[name], IN_STOCK_SKU))
        entry: dict[str, Any] = {
            "confirmed_seen_by_wrk": seen,
            **sold,
            "unseen_orders": sold["orders"] - seen,
            "stock_conserved": sold["db_stock"] + sold["orders"] == stock,
        }
        if name != "naive":
            entry["admin_report"] = wait_settled(targets[name])
        found[name] = entry
    return found


def audit_failures(
    checks: dict[str, Any], runs: Sequence[wrk.WrkResult], connections: int
) -> list[str]:
    """What the audit found wrong: a benchmark that oversells must not pass quietly."""
    found = []
    for name, entry in checks.items():
        mine = [r for r in runs if r.target == name and r.path == IN_STOCK]
        # In flight when wrk stopped, or given up on by wrk, may still commit.
        in_flight = connections * len(mine) + sum(sum(r.socket_errors.values()) for r in mine)
        if not entry["stock_conserved"]:
            found.append(f"{name}: database stock + orders != initial stock ({entry})")
        if not 0 <= entry["unseen_orders"] <= in_flight:
            found.append(
                f"{name}: {entry['orders']} orders for {entry['confirmed_seen_by_wrk']} 201s "
                f"(at most {in_flight} may be unseen)"
            )
        report = entry.get("admin_report")
        if report is not None and (
            report.get("pending") != 0 or report.get("redis_stock") != report.get("db_stock")
        ):
            found.append(f"{name}: Redis and PostgreSQL disagree once settled ({report})")
    return found
