"""Chaos scenario 7: every fault of scenarios 1-6, one after the other, in a
seeded random order, from the middle of one sale on.

Each runs :func:`tests.chaos.sale.run_scenario` (the sale, the fault in its
middle and every check are described there), with the flush lock on and off.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Awaitable, Callable

import pytest

from testkit.gateways import SIGTERM_EXIT_S
from testkit.postgres_servers import PostgresCluster
from testkit.redis_servers import command, redis_client
from tests.chaos.faults import sleep_fault, stop_lock_holder
from tests.chaos.reporting import Diagnostics
from tests.chaos.sale import LOCKS, SalePlan, run_scenario, settings_for
from tests.chaos.stacks import Stack, proxied_stack

# --------------------------------------------------------------------------- 7. all at once

FaultStep = Callable[[Stack, str, random.Random], Awaitable[str]]


async def _redis_restart(stack: Stack, sku: str, rng: random.Random) -> str:
    assert stack.redis_server is not None
    await stack.redis_server.restart()
    return "redis-restart"


async def _script_flush(stack: Stack, sku: str, rng: random.Random) -> str:
    async with redis_client(await stack.redis_address()) as r:
        await command(r, "SCRIPT", "FLUSH")
    return "script-flush"


async def _holder_stop(stack: Stack, sku: str, rng: random.Random) -> str:
    stop_s = stack.lease_s + 0.5
    if stack.lock == "redis":
        try:
            stop = await stop_lock_holder(stack, sku, stop_s=stop_s, within=5)
        except TimeoutError:
            pass  # nobody flushing right now: pause someone anyway
        else:
            return f"holder-stop(gw{stop.gateway.index},{stop.fence_after > stop.fence_before})"
    gateway = rng.choice([g for g in stack.gateways if g.running])
    gateway.pause()
    try:
        await sleep_fault(stop_s)
    finally:
        gateway.resume()
    return f"pause(gw{gateway.index})"


async def _redis_latency(stack: Stack, sku: str, rng: random.Random) -> str:
    assert stack.redis_proxy is not None
    stack.redis_proxy.set_latency(50, jitter_ms=150)
    try:
        await sleep_fault(1.0)
    finally:
        stack.redis_proxy.clear()
    return "redis-latency"


async def _pg_latency(stack: Stack, sku: str, rng: random.Random) -> str:
    stack.pg_proxy.set_latency(50, jitter_ms=150)
    try:
        await sleep_fault(1.0)
    finally:
        stack.pg_proxy.clear()
    return "pg-latency"


async def _redis_stall(stack: Stack, sku: str, rng: random.Random) -> str:
    assert stack.redis_proxy is not None
    stack.redis_proxy.stall()
    try:
        await sleep_fault(stack.lease_s + 0.5)
    finally:
        stack.redis_proxy.clear()
    return "redis-stall"


async def _pg_restart(stack: Stack, sku: str, rng: random.Random) -> str:
    await stack.pg.restart("fast")
    return "pg-restart"


async def _pg_blackhole(stack: Stack, sku: str, rng: random.Random) -> str:
    stack.pg_proxy.blackhole(True)
    try:
        await sleep_fault(2.0)
    finally:
        stack.pg_proxy.blackhole(False)
    return "pg-blackhole"


async def _gateway_sigkill(stack: Stack, sku: str, rng: random.Random) -> str:
    gateway = rng.choice(list(stack.gateways))
    await gateway.crash()
    await gateway.start()
    return f"sigkill(gw{gateway.index})"


async def _gateway_sigterm(stack: Stack, sku: str, rng: random.Random) -> str:
    gateway = rng.choice(list(stack.gateways))
    gateway.kill(signal.SIGTERM)
    status = await gateway.wait_exit(within=SIGTERM_EXIT_S)
    assert status == 0, (
        f"gateway {gateway.index} exited {status} on SIGTERM:\n{gateway.log_tail(8)}"
    )
    await gateway.start()
    return f"sigterm(gw{gateway.index})"


# Faults 1-6 as they exist on one Redis behind a proxy: Redis losing its data
# (restart) stands in for the failover's loss of the newest writes.
ALL_FAULTS: dict[str, FaultStep] = {
    "redis-restart": _redis_restart,
    "script-flush": _script_flush,
    "holder-stop": _holder_stop,
    "redis-latency": _redis_latency,
    "pg-latency": _pg_latency,
    "redis-stall": _redis_stall,
    "pg-restart": _pg_restart,
    "pg-blackhole": _pg_blackhole,
    "gateway-sigkill": _gateway_sigkill,
    "gateway-sigterm": _gateway_sigterm,
}


def _in_order(
    order: list[str], rng: random.Random, plan: SalePlan, mid_sale: list[bool], tag: str
) -> Callable[[Stack, str], Awaitable[str]]:
    """One fault running every fault of ``order`` in turn; notes whether each began
    while stock was left."""

    async def everything(stack: Stack, sku: str) -> str:
        done = []
        for name in order:
            mid_sale.append(await stack.orders(sku) < plan.stock)
            done.append(await ALL_FAULTS[name](stack, sku, rng))
        return f"{tag}: " + ",".join(done) + f" ({sum(mid_sale)}/{len(order)} mid-sale)"

    return everything


CHAOS_SEED = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1, 10**6))
CHAOS_ROUNDS = int(os.environ.get("CHAOS_ROUNDS") or 1)


@pytest.mark.chaos
@pytest.mark.timeout(120 * CHAOS_ROUNDS + 60)
@LOCKS
async def test_all_faults_in_random_order(
    lock: str, pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """Every fault of scenarios 1-6, in an order drawn from CHAOS_SEED, one after the
    other from the middle of one sale on, for CHAOS_ROUNDS rounds (a new sku each)
    on the same servers and gateways; every round passes every check of a scenario.
    The seed is printed and in the report line; setting it replays the same fault
    order and targets (not the same timing). The line also says how many faults
    began while stock was left.

    Design: one Redis behind a proxy, not the Sentinel pair. Sentinels hand out
    the data nodes' real addresses, so a Sentinel topology has no Redis link to
    slow or stall; here Redis coming back empty (a superset of what a failover
    to a lagging replica loses) stands in for the failover, and every other
    fault applies as in its own scenario."""
    diagnostics.append(lambda: f"CHAOS_SEED={CHAOS_SEED} (replay with this seed)")
    print(f"\nall-at-once [{lock}]: CHAOS_SEED={CHAOS_SEED} CHAOS_ROUNDS={CHAOS_ROUNDS}")
    rng = random.Random(f"{CHAOS_SEED}-{lock}")
    async with proxied_stack(pg, diagnostics, settings_for(lock)) as stack:
        for round_no in range(1, CHAOS_ROUNDS + 1):
            order = list(ALL_FAULTS)
            rng.shuffle(order)
            plan = SalePlan(stock=240, users=300, spread_s=14.0, trigger=0.05, seed=round_no)
            mid_sale: list[bool] = []
            everything = _in_order(order, rng, plan, mid_sale, f"seed {CHAOS_SEED} r{round_no}")
            await run_scenario(
                stack,
                f"7 all at once r{round_no} [{lock}]",
                everything,
                plan,
                sku=f"flash-r{round_no}",
            )
