"""Checks of a scenario beyond the invariants: reconciliation done, every order
event relayed, and the story of every request id a check named."""

from __future__ import annotations

import time
from collections.abc import Sequence

import asyncpg

from gateway.ops.audit import SkuAudit
from testkit.driver import CONFIRMED, SOLD_OUT, DriverSummary
from testkit.invariants import InvariantReport
from testkit.order_events import EVENTS_OF_SKU, check_arrivals
from testkit.polling import wait_for
from testkit.redis_servers import redis_client
from tests.chaos.stacks import Stack

# The only final answers a first-wave buyer may get: each buys once, with one request id.
FINAL_ANSWERS = {CONFIRMED, SOLD_OUT}


async def quiesce(stack: Stack, sku: str, within: float = 20.0) -> SkuAudit:
    """Wait until reconciliation is done: the ledger is empty and Redis stock plus
    pending equals database stock (or the key is missing, reloaded on next use)."""
    last: list[SkuAudit] = []

    async def quiet() -> SkuAudit | None:
        row = await stack.audit(sku)
        last[:] = [row]
        return row if row.pending == 0 and not row.drift else None

    try:
        return await wait_for(quiet, within=within, what="ledger empty, no drift", interval=0.1)
    except TimeoutError:
        seen = last[0] if last else "no audit answered"
        raise TimeoutError(
            f"reconciliation unfinished after {within:.0f}s (ledger not empty or drift): {seen}"
        ) from None


async def every_event_relayed(stack: Stack, sku: str, within: float = 30.0) -> None:
    """Every order of ``sku`` has its event, and every event reached the
    gateways' stream (``<key prefix>:events``) whatever the fault did to the
    relays on the way: a duplicate only with its own event_id, each order's
    versions in order (check_arrivals)."""
    con = await asyncpg.connect(stack.database_url, timeout=5)
    try:
        orders = await con.fetchval("SELECT count(*) FROM orders WHERE sku = $1", sku)
        ids = {(r[0], r[1]): r[2] for r in await con.fetch(EVENTS_OF_SKU, sku)}
    finally:
        await con.close()
    assert len({order for order, version in ids if version == 1}) == orders, (
        f"{orders} orders, {len(ids)} events: an order without its event"
    )
    arrived: list[dict[str, str]] = []

    async def relayed() -> bool:
        async with redis_client(await stack.redis_address()) as r:
            entries: list[tuple[str, dict[str, str]]] = await r.xrange(  # type: ignore[assignment]
                f"{stack.key_prefix}:events"
            )
        arrived[:] = [fields for _, fields in entries if fields["sku"] == sku]
        return {(e["order_id"], int(e["version"])) for e in arrived} >= set(ids)

    try:
        await wait_for(relayed, within=within, what="every event on the stream", interval=0.2)
    finally:
        check_arrivals(arrived, ids)


async def explain(stack: Stack, report: InvariantReport, summaries: Sequence[DriverSummary]) -> str:
    """The story of every request id a hard check named: each attempt the client
    made (instance, wall clock, status or error) and the order row, if any."""
    named = [
        item.split(":", 1)[0]
        for items in (
            report.false_confirmations,
            report.order_id_mismatches,
            report.contradicted,
            report.unacknowledged,
        )
        for item in items
    ][:6]
    if not named:
        return ""
    records = {r.request_id: r for s in summaries for r in s.records}
    con = await asyncpg.connect(stack.database_url, timeout=5)
    try:
        rows = {
            r["request_id"]: r
            for r in await con.fetch(
                "SELECT request_id, order_id::text, created_at FROM orders"
                " WHERE request_id = ANY($1::text[])",
                named,
            )
        }
    finally:
        await con.close()
    lines = []
    for rid in named:
        row = rows.get(rid)
        lines.append(
            f"  {rid}: row "
            + (f"{row['order_id']} created_at {row['created_at'].isoformat()}" if row else "none")
        )
        record = records.get(rid)
        for a in record.attempts if record else []:
            at = (
                time.strftime("%H:%M:%S", time.gmtime(a.started_at)) + f"{a.started_at % 1:.3f}"[1:]
            )
            answer = a.error or f"{a.status} {a.body}"
            lines.append(f"    {at}Z gw{a.instance} {a.elapsed_s * 1000:.0f}ms -> {answer}")
    return "\n".join(lines)


def unfinished(summary: DriverSummary) -> str:
    """Clients without an allowed final answer, with what they saw last."""
    odd = [r for r in summary.records if r.outcome not in FINAL_ANSWERS]
    return "; ".join(f"{r.request_id}: {r.outcome} ({r.last()})" for r in odd[:5])
