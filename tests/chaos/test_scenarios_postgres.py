"""Chaos scenario 5: PostgreSQL restarts or becomes unreachable in the middle of a sale.

Each runs :func:`tests.chaos.sale.run_scenario` (the sale, the fault in its
middle and every check are described there), with the flush lock on and off.
"""

from __future__ import annotations

import time

import pytest

from testkit.driver import (
    ClientPolicy,
)
from testkit.postgres_servers import PostgresCluster
from tests.chaos.checks import every_event_relayed
from tests.chaos.faults import sleep_fault
from tests.chaos.reporting import Diagnostics
from tests.chaos.sale import LOCKS, SalePlan, run_scenario, settings_for
from tests.chaos.stacks import Stack, proxied_stack

# --------------------------------------------------------------------------- 5. PostgreSQL


@pytest.mark.chaos
@pytest.mark.timeout(90)
@LOCKS
async def test_postgres_restarts_mid_sale(
    lock: str, pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """PostgreSQL restarts (fast shutdown) mid-sale: open connections break,
    flushes in progress fail with 503 and give their reservations back, clients
    retry, and the pools reconnect once it is back. Nothing confirmed is lost,
    and every order's event reaches the stream."""
    async with proxied_stack(pg, diagnostics, settings_for(lock)) as stack:

        async def restart(stack: Stack, sku: str) -> str:
            started = time.monotonic()
            await stack.pg.restart("fast")
            return f"postgres fast restart ({time.monotonic() - started:.1f}s)"

        run = await run_scenario(stack, f"5 postgres restart [{lock}]", restart)
        await every_event_relayed(stack, run.sku)


@pytest.mark.chaos
@pytest.mark.timeout(90)
@LOCKS
async def test_postgres_unreachable_for_five_seconds(
    lock: str, pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """PostgreSQL unreachable for 5 s mid-sale (the proxy swallows every byte, then
    drops the connections that lost data): flushes fail and their buyers get 503
    with Retry-After; the reservations come back (compensation: given back at once,
    or settled by the reconciler from the order rows), and once the link heals the
    sale resumes and the whole stock sells; every order's event reaches the
    stream."""
    async with proxied_stack(pg, diagnostics, settings_for(lock)) as stack:

        async def blackhole(stack: Stack, sku: str) -> str:
            stack.pg_proxy.blackhole(True)
            try:
                await sleep_fault(5.0)
            finally:
                stack.pg_proxy.blackhole(False)
            return "postgres blackholed 5s"

        # Buyers wait longer than the outage, so those whose batch was stuck in it
        # hear the 503 that follows (with a 3 s timeout they would have left).
        plan = SalePlan(policy=ClientPolicy(attempt_timeout_s=8))
        run = await run_scenario(stack, f"5 postgres unreachable [{lock}]", blackhole, plan)
        assert run.first is not None
        answers = run.first.attempts_by()
        assert answers["503"] >= 1, f"no buyer was told 503 during the outage: {answers}"
        await every_event_relayed(stack, run.sku)
