"""Chaos scenario 6: a gateway is SIGKILLed or SIGTERMed with a batch in flight.

Each runs :func:`tests.chaos.sale.run_scenario` (the sale, the fault in its
middle and every check are described there), with the flush lock on and off.
"""

from __future__ import annotations

import signal
import time

import pytest

from gateway.redis.layout import ledger
from testkit.gateways import SIGTERM_EXIT_S
from testkit.postgres_servers import PostgresCluster
from tests.chaos.checks import every_event_relayed
from tests.chaos.faults import first_sent_to, reserved_on, young_batch_on
from tests.chaos.reporting import Diagnostics
from tests.chaos.sale import LOCKS, SKU, run_scenario, settings_for
from tests.chaos.stacks import Stack, proxied_stack

# --------------------------------------------------------------------------- 6. gateway dies


@pytest.mark.chaos
@pytest.mark.timeout(90)
@LOCKS
async def test_gateway_killed_with_batches_in_flight(
    lock: str, pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """Gateway 0 is SIGKILLed while its batch of reservations waits to flush
    (batch wait 800 ms: a loaded machine's polls still catch a batch filling
    before the first wave ends; under the Redis lock, any of its reservations:
    there its batches wait out gateway 1's hold of the lock, never young): those
    reservations are orphaned in the ledger.
    Their buyers retry on gateway 1 (in_progress) until its reconciler settles them after
    the reservation timeout (stock and buyer given back); they buy again and the
    whole stock sells. Gateway 1's relay delivers every order's event.
    The reservation timeout is 2 s: with 1 s, gateway 1's reconciler gave back
    a batch of gateway 0's still waiting, and the first wave ended before the fault."""
    settings = settings_for(lock, batch_wait_ms=800, batch_max=1000, reservation_timeout_s=2)
    async with proxied_stack(pg, diagnostics, settings) as stack:
        orphaned = []

        async def sigkill(stack: Stack, sku: str) -> str:
            await stack.gateways[0].crash()
            left = [e for e in ledger(await stack.ledger(sku)) if first_sent_to(e, 0)]
            orphaned.extend(left)
            return f"SIGKILL gw0 with {len(left)} reservations in its batch"

        if lock == "redis":
            ready = reserved_on(stack, SKU)
        else:
            ready = young_batch_on(stack, SKU, younger_than_ms=400)
        run = await run_scenario(stack, f"6 gateway SIGKILL [{lock}]", sigkill, ready=ready)
        await every_event_relayed(stack, run.sku)
        assert stack.gateways[0].returncode == -signal.SIGKILL
        assert orphaned, "the kill orphaned no reservation: the fault missed its target"
        assert stack.gateways.log_lines("reservations_settled"), "nobody settled the orphans"


@pytest.mark.chaos
@pytest.mark.timeout(90)
@LOCKS
async def test_gateway_sigterm_drains_mid_sale(
    lock: str, pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """Gateway 0 gets SIGTERM mid-sale while a batch of its reservations is queued
    (batch wait 300 ms): it answers new purchases 503 (clients move to gateway 1),
    flushes and settles what it queued (its "draining" log counts it), and exits 0
    within its drain bound (3 s); nobody is left without an answer, and every
    order's event reaches the stream."""
    settings = settings_for(lock, batch_wait_ms=300, batch_max=1000)
    async with proxied_stack(pg, diagnostics, settings) as stack:

        async def sigterm(stack: Stack, sku: str) -> str:
            gateway = stack.gateways[0]
            started = time.monotonic()
            gateway.kill(signal.SIGTERM)
            status = await gateway.wait_exit(within=SIGTERM_EXIT_S)
            took = time.monotonic() - started
            assert status == 0, f"gateway 0 exited {status}:\n{gateway.log_tail()}"
            assert took < 3 + 2, f"drain took {took:.1f}s, bound 3s"
            return f"SIGTERM gw0 with a batch queued, exit {status} after {took:.1f}s"

        ready = young_batch_on(stack, SKU, younger_than_ms=150)
        run = await run_scenario(stack, f"6 gateway SIGTERM [{lock}]", sigterm, ready=ready)
        await every_event_relayed(stack, run.sku)
        (draining,) = stack.gateways[0].log_events("draining")
        assert draining["queued"] >= 1, f"nothing was queued at SIGTERM: {draining}"
