"""Chaos scenarios 1 and 4: Redis fails over to a lagging replica, restarts empty,
or forgets its scripts, in the middle of a sale.

Each runs :func:`tests.chaos.sale.run_scenario` (the sale, the fault in its
middle and every check are described there), with the flush lock on and off.
"""

from __future__ import annotations

import time

import pytest

from testkit.postgres_servers import PostgresCluster
from testkit.redis_servers import command, redis_client
from tests.chaos.reporting import Diagnostics
from tests.chaos.sale import LOCKS, run_scenario, settings_for
from tests.chaos.stacks import Stack, metric_total, proxied_stack, sentinel_stack

# --------------------------------------------------------------------------- 1. failover


@pytest.mark.chaos
@pytest.mark.timeout(90)
@LOCKS
async def test_redis_primary_killed_and_replica_promoted(
    lock: str, pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """SIGKILL of the Redis primary mid-sale; Sentinel promotes the replica, which
    may lack the newest decrements, buyers, ledger entries and locks. The gateways
    follow the Sentinels to it; the database guard and the unique constraints
    reject what the stale copy over-admits: no oversell, no false confirmation,
    and after reconciliation the whole stock sells."""
    async with sentinel_stack(pg, diagnostics, settings_for(lock)) as stack:

        async def failover(stack: Stack, sku: str) -> str:
            assert stack.sentinel is not None
            old = await stack.sentinel.kill_primary()
            started = time.monotonic()
            new = await stack.sentinel.wait_for_failover(within=20)
            took = time.monotonic() - started
            return f"SIGKILL redis primary :{old[1]}, :{new[1]} promoted in {took:.1f}s"

        await run_scenario(stack, f"1 redis failover [{lock}]", failover)


# --------------------------------------------------------------------------- 4. Redis loses data


@pytest.mark.chaos
@pytest.mark.timeout(90)
@LOCKS
async def test_redis_restarts_empty_mid_sale(
    lock: str, pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """Redis is killed and comes back empty mid-sale: stock counters, buyers, the
    ledger, confirmed ids, locks and scripts are gone. The gateways reload the
    scripts and the stock from the database (minus nothing pending, since the ledger
    is gone too, so Redis over-admits), and the guarded UPDATE rejects the excess:
    no oversell, replays keep their orders, and the second wave sells the rest."""
    async with proxied_stack(pg, diagnostics, settings_for(lock)) as stack:

        async def restart(stack: Stack, sku: str) -> str:
            assert stack.redis_server is not None
            await stack.redis_server.restart()
            return "redis SIGKILL + restart, empty"

        await run_scenario(stack, f"4 redis restart empty [{lock}]", restart)
        reloads = await metric_total(stack, "flashsale_stock_reloads_total")
        assert reloads >= 1, "no gateway reloaded the stock: the restart went unnoticed"


@pytest.mark.chaos
@pytest.mark.timeout(90)
@LOCKS
async def test_script_flush_mid_sale(
    lock: str, pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """SCRIPT FLUSH mid-sale: every EVALSHA meets NOSCRIPT, the gateways load the
    scripts again and retry; nobody gets an error for it and nothing is lost."""
    async with proxied_stack(pg, diagnostics, settings_for(lock)) as stack:

        async def flush_scripts(stack: Stack, sku: str) -> str:
            async with redis_client(await stack.redis_address()) as r:
                await command(r, "SCRIPT", "FLUSH")
            return "SCRIPT FLUSH"

        await run_scenario(stack, f"4 script flush [{lock}]", flush_scripts)
        reloads = await metric_total(stack, "flashsale_noscript_reloads_total")
        assert reloads >= 1, "no NOSCRIPT reload counted: the flush went unnoticed"
