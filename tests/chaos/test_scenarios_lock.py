"""Chaos scenarios 2 and 3: the flush lock's holder paused past its lease or killed
mid-flush, and a slow then stalled network that outlasts the lease, in the middle
of a sale. Both gateways sell the one hot sku, so its lock is wanted by the other
instance whenever one holds it: the holder hands it over after its current flush.

Each runs :func:`tests.chaos.sale.run_scenario` (the sale, the fault in its
middle and every check are described there), with the flush lock on and off.
"""

from __future__ import annotations

import signal
from datetime import datetime

import asyncpg
import pytest

from gateway.redis.layout import lock_key
from testkit.metrics import metric, scrape
from testkit.polling import wait_for
from testkit.postgres_servers import PostgresCluster
from testkit.redis_servers import redis_client
from tests.chaos.faults import kill_lock_holder, sleep_fault, stop_lock_holder, young_batch_on
from tests.chaos.reporting import Diagnostics
from tests.chaos.sale import LOCKS, SKU, SalePlan, run_scenario, settings_for
from tests.chaos.stacks import Stack, proxied_stack

# --------------------------------------------------------------------------- 2. lock expiry


@pytest.mark.chaos
@pytest.mark.timeout(90)
@LOCKS
async def test_lock_holder_paused_past_its_lease(
    lock: str, pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """With the Redis lock (lease 0.5 s) the gateway caught holding the sku's flush
    lock is SIGSTOPped for 2 s: the lease runs out, the other instance acquires
    (the fence counter grows) and keeps flushing; on SIGCONT the stale holder learns
    it lost the lock (flashsale_locks_lost_total > 0 on it) and no batch is applied
    twice (stock adds up, one order per request and per user). Without a lock the
    same pause hits gateway 0 mid-sale and the conditional UPDATE alone holds."""
    settings = settings_for(lock, lock_lease_s=0.5)
    async with proxied_stack(pg, diagnostics, settings) as stack:
        stops = []

        meanwhile: list[int] = []

        async def pause_holder(stack: Stack, sku: str) -> str:
            if lock == "none":
                stack.gateways[0].pause()
                try:
                    paused_at = await _database_now(stack)
                    await sleep_fault(2.0)
                    meanwhile.append(await _orders_since(stack, sku, paused_at))
                finally:
                    stack.gateways[0].resume()
                return f"SIGSTOP gw0 2.0s (no lock), {meanwhile[0]} orders meanwhile"
            stop = await stop_lock_holder(stack, sku, stop_s=2.0, until_sold_s=5.0)
            stops.append(stop)
            meanwhile.append(stop.orders_meanwhile)
            return (
                f"SIGSTOP lock holder gw{stop.gateway.index} {stop.stopped_s:.1f}s (lease 0.5s),"
                f" fence +{stop.fence_after - stop.fence_before},"
                f" {stop.orders_meanwhile} orders meanwhile"
            )

        # Without a lock, gateway 1 must have buyers to serve while gateway 0 is
        # stopped: its batch is filling (batch wait 50 ms) when the fault starts.
        # On a busy machine the first wave can otherwise have arrived and been
        # answered by then, and gateway 1 rightly sells nothing meanwhile.
        ready = (
            young_batch_on(stack, SKU, younger_than_ms=25, gateway=1) if lock == "none" else None
        )
        await run_scenario(stack, f"2 lock expiry [{lock}]", pause_holder, ready=ready)
        assert meanwhile[0] > 0, "the other instance sold nothing while the first was stopped"
        if lock == "none":
            return
        (stop,) = stops
        assert stop.taken_over, f"nobody acquired the lock while its holder slept: {stop}"
        assert any(o != stop.owner for o in stop.owners_seen), stop

        async def learned() -> float:
            return metric(await scrape(stop.gateway.url), "flashsale_locks_lost_total")

        lost = await wait_for(learned, within=10, what="the stale holder counts a lost lock")
        assert lost >= 1


@pytest.mark.chaos
@pytest.mark.timeout(90)
async def test_lock_holder_killed_mid_flush(pg: PostgresCluster, diagnostics: Diagnostics) -> None:
    """With the Redis lock (lease 1 s) and the database's link slowed (40 ms each way,
    so a flush takes over 80 ms and a holder spends its hold inside flushes), the
    gateway caught holding the sku's flush lock is SIGKILLed. Its flush dies
    committed or not: its buyers retry on the other gateway and get their order
    (a replay) or, once the reconciler gave their reservation back, buy again. The
    other gateway takes the lock when the lease runs out (the fence grows) and sells
    the rest; no oversell, no false 201, the audit clean."""
    async with proxied_stack(pg, diagnostics, settings_for("redis")) as stack:
        kills = []

        async def kill_holder(stack: Stack, sku: str) -> str:
            stack.pg_proxy.set_latency(40)
            try:
                kill = await kill_lock_holder(stack, sku)
            finally:
                stack.pg_proxy.clear()
            kills.append(kill)
            return (
                f"SIGKILL lock holder gw{kill.gateway.index} with the database link slowed"
                f" 40 ms, {kill.pending} reservations pending"
            )

        await run_scenario(stack, "2 lock holder SIGKILL mid-flush [redis]", kill_holder)
        (kill,) = kills
        assert kill.gateway.returncode == -signal.SIGKILL
        async with redis_client(await stack.redis_address(), within=2) as r:
            fence = int(await r.get(lock_key(stack.key_prefix, SKU) + ":fence") or 0)
        assert fence > kill.fence, "nobody acquired the lock after its holder died"


async def _database_now(stack: Stack) -> datetime:
    """PostgreSQL's clock, which stamps each order's ``created_at``."""
    con = await asyncpg.connect(stack.database_url, timeout=2)
    try:
        now: datetime = await con.fetchval("SELECT now()", timeout=2)
        return now
    finally:
        await con.close(timeout=2)


async def _orders_since(stack: Stack, sku: str, since: datetime) -> int:
    """Orders of ``sku`` whose transaction began after ``since``: with gateway 0
    stopped since then, the ones gateway 1 committed."""
    con = await asyncpg.connect(stack.database_url, timeout=2)
    try:
        count: int = await con.fetchval(
            "SELECT count(*) FROM orders WHERE sku = $1 AND created_at > $2", sku, since, timeout=2
        )
        return count
    finally:
        await con.close(timeout=2)


# --------------------------------------------------------------------------- 3. network


@pytest.mark.chaos
@pytest.mark.timeout(90)
@LOCKS
async def test_network_latency_then_stall_longer_than_lease(
    lock: str, pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """Mid-sale, 50-200 ms of latency with jitter on the Redis link, then on the
    PostgreSQL link, then a 1.5 s stall of the Redis link, longer than the 1 s lease
    (a holder caught in it loses its lease while its commands hang; the held bytes
    arrive late). No oversell, no false confirmation, nothing lost."""
    async with proxied_stack(pg, diagnostics, settings_for(lock, lock_lease_s=1)) as stack:
        assert stack.redis_proxy is not None

        async def network(stack: Stack, sku: str) -> str:
            redis_proxy, pg_proxy = stack.redis_proxy, stack.pg_proxy
            assert redis_proxy is not None
            try:
                redis_proxy.set_latency(50, jitter_ms=150)
                await sleep_fault(1.5)
                redis_proxy.clear()
                pg_proxy.set_latency(50, jitter_ms=150)
                await sleep_fault(1.5)
                pg_proxy.clear()
                redis_proxy.stall()
                await sleep_fault(1.5)
            finally:
                redis_proxy.clear()
                pg_proxy.clear()
            return "redis 50-200ms 1.5s, pg 50-200ms 1.5s, redis stall 1.5s (lease 1s)"

        plan = SalePlan(stock=100, users=170, spread_s=5.0)
        await run_scenario(stack, f"3 network delay+stall [{lock}]", network, plan)
