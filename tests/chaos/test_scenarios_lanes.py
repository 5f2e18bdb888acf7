"""Chaos scenario 8: the worker that flushes the hot sku for its gateway dies or
stops while the other worker passes it purchases (gateway.write.lanes), or
Redis fails over under them.

Both gateways run two workers (GATEWAY_WORKERS=2); in each, worker
``owner_of(SKU, 2)`` owns the sku and flushes what both reserved. Each runs
:func:`tests.chaos.sale.run_scenario` (the sale, the fault in its middle and
every check are described there), with the Redis flush lock.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from gateway.ops.audit import Finding
from gateway.write.lanes import owner_of
from testkit.driver import ClientPolicy
from testkit.gateways import SIGTERM_EXIT_S
from testkit.metrics import metric, scrape
from testkit.polling import wait_for
from testkit.postgres_servers import PostgresCluster
from tests.chaos.faults import passed_into_young_batch, stop_lock_holder
from tests.chaos.reporting import Diagnostics
from tests.chaos.sale import SKU, Fault, SalePlan, ScenarioRun, run_scenario, settings_for
from tests.chaos.stacks import Stack, proxied_stack, sentinel_stack

WORKERS = 2
OWNER = owner_of(SKU, WORKERS)
# Batches that fill for 2 s, aimed at while under 1.8 s old: a fault aimed by
# passed_into_young_batch finds what the other worker passed the owner still
# queued there, though a loaded machine's polls are slow and a flush waiting for
# the lock ages the next batch before it shows (800 ms batches aimed at under
# 400 ms left CI's run no poll in time). Reservations wait out a batch and its
# flush before they count as orphans; a buyer waits out both too.
FILLING = settings_for(
    "redis", workers=WORKERS, batch_wait_ms=2000, batch_max=1000, reservation_timeout_s=5
)


async def run_aimed_at_passed(stack: Stack, name: str, fault: Fault) -> ScenarioRun:
    """:func:`run_scenario` with ``fault`` early in the sale (5 % sold), once gw0's
    owner of the sku has a batch filling with a purchase its other worker has
    just passed it (:func:`passed_into_young_batch`). Twice the default sale,
    arriving over four times as long: the stock lasts several batches past the
    first flush, so slow polls still find one young, and the buyers' attempts
    outlast a batch and its flush."""
    ready = passed_into_young_batch(stack, SKU, younger_than_ms=1800)
    plan = SalePlan(
        stock=200, users=340, spread_s=12.0, trigger=0.05, policy=ClientPolicy(attempt_timeout_s=8)
    )
    return await run_scenario(stack, name, fault, plan, ready=ready)


# --------------------------------------------------------------------------- 8. lanes


@pytest.mark.chaos
@pytest.mark.timeout(90)
async def test_the_skus_owner_worker_killed_with_purchases_passed_to_it(
    pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """Gateway 0's owner of the sku is SIGKILLed while its batch fills (batch wait
    2 s) with purchases the other worker passed it: the other worker loses
    its link and answers those buyers 503 (OutcomeUnknown), their reservations
    left in the ledger; the supervisor stops it too, and gateway 0 is started
    again. The buyers retry, the reconciler settles the orphans, and the sale
    ends with no oversell, no false 201, nothing lost and the audit clean."""
    async with proxied_stack(pg, diagnostics, FILLING) as stack:
        # Purchases awaiting the owner when it died, as the other worker logged them.
        lost: list[int] = []

        async def kill_owner(stack: Stack, sku: str) -> str:
            gateway = stack.gateways[0]
            os.kill(gateway.workers()[OWNER], signal.SIGKILL)
            status = await gateway.wait_exit(within=SIGTERM_EXIT_S)
            lost.extend(e["passed"] for e in gateway.log_events("lane_lost"))
            orphans = len(await stack.ledger(sku))
            await gateway.start()
            return (
                f"SIGKILL gw0's worker {OWNER} (the sku's owner) with a batch filling,"
                f" {sum(lost)} passed to it answered OutcomeUnknown, supervisor exit {status},"
                f" {orphans} reservations left, gw0 restarted"
            )

        run = await run_aimed_at_passed(stack, "8 lane owner SIGKILL [redis]", kill_owner)
        assert sum(lost) >= 1, "no purchase awaited the killed owner: the fault missed"
        assert run.first is not None
        told = [
            a
            for r in run.first.records
            for a in r.attempts
            if a.status == 503 and f"lost the lane to worker {OWNER}" in str(a.body)
        ]
        assert len(told) == sum(lost), f"{sum(lost)} purchases lost with the lane, answered {told}"
        assert stack.gateways.log_lines("reservations_settled"), "nobody settled the orphans"


@pytest.mark.chaos
@pytest.mark.timeout(90)
async def test_the_skus_owner_worker_stopped_past_its_lease(
    pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """A gateway's owner of the sku, caught holding its flush lock (lease 0.5 s),
    is SIGSTOPped for 2 s (longer, up to 5 s more, until the other gateway sells
    on a loaded machine): what the other worker of its gateway passes it
    meanwhile waits, and the other gateway's owner
    acquires the lock (the fence grows) and sells. On SIGCONT the stopped worker
    learns it lost the lock (flashsale_locks_lost_total) and answers what it was
    passed; no oversell, no false 201, nothing lost, the audit clean."""
    settings = settings_for("redis", workers=WORKERS, lock_lease_s=0.5)
    async with proxied_stack(pg, diagnostics, settings) as stack:
        stops = []

        async def pause_owner(stack: Stack, sku: str) -> str:
            stop = await stop_lock_holder(stack, sku, stop_s=2.0, lane=OWNER, until_sold_s=5.0)
            stops.append(stop)
            return (
                f"SIGSTOP lock holder gw{stop.gateway.index} worker {OWNER} (the sku's owner)"
                f" {stop.stopped_s:.1f}s (lease 0.5s),"
                f" fence +{stop.fence_after - stop.fence_before},"
                f" {stop.orders_meanwhile} orders meanwhile"
            )

        await run_scenario(stack, "8 lane owner SIGSTOP past lease [redis]", pause_owner)
        (stop,) = stops
        assert stop.taken_over, f"nobody acquired the lock while its holder slept: {stop}"
        assert stop.orders_meanwhile > 0, "the other gateway sold nothing meanwhile"

        async def learned() -> float:
            return metric(await scrape(stop.gateway.url), "flashsale_locks_lost_total")

        assert await wait_for(learned, within=10, what="the stopped owner counts a lost lock")


@pytest.mark.chaos
@pytest.mark.timeout(90)
async def test_redis_failover_with_purchases_passed_to_the_owner(
    pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """The Redis primary is SIGKILLed while gateway 0's owner of the sku has a
    batch filling (batch wait 2 s) with purchases the other worker passed it,
    and Sentinel promotes the replica, which may lack the newest reservations.
    The owner's flush of that batch fails with Redis gone, and its 503 travels
    back over the lane to the buyers the other worker holds; they retry on the
    promoted primary. No oversell, no false 201, nothing lost, and the sale
    ends with the ledger empty, no drift and the audit clean."""
    async with sentinel_stack(pg, diagnostics, FILLING) as stack:
        # gw0's purchases passed between its workers when the primary died.
        passed: list[float] = []

        async def failover(stack: Stack, sku: str) -> str:
            assert stack.sentinel is not None
            scraped = await scrape(stack.gateways[0].url)
            passed.append(metric(scraped, "flashsale_lane_passed_total"))
            old = await stack.sentinel.kill_primary()
            started = time.monotonic()
            new = await stack.sentinel.wait_for_failover(within=20)
            took = time.monotonic() - started
            return (
                f"SIGKILL redis primary :{old[1]} with gw0's owner batch filling"
                f" ({passed[0]:.0f} passed to it so far), :{new[1]} promoted in {took:.1f}s"
            )

        run = await run_aimed_at_passed(stack, "8 lane redis failover [redis]", failover)
        assert passed[0] > 0, "no purchase passed between gw0's workers before the failover"
        failed = metric(await scrape(stack.gateways[0].url), "flashsale_flush_failures_total")
        assert failed >= 1, "no flush of gw0's owner failed: the failover missed its batch"
        final = run.audits[-1]
        assert final.pending == 0, f"ledger not empty at the end: {final}"
        assert not final.drift, f"Redis and the database disagree at the end: {final}"
        assert final.verdict == Finding.OK, f"audit at the end: {final}"
