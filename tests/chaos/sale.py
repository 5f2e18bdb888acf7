"""One sale with a fault in its middle: the run every chaos scenario makes.

A scenario (``tests/chaos/test_scenarios_*.py``) builds a :class:`Stack` (two
gateway subprocesses on one private Redis and one private PostgreSQL database,
each behind a fault proxy, or on a Sentinel-watched Redis pair), then
calls :func:`run_scenario` with a fault. That runs the sale the same way every
time:

1. a sku with less stock than buyers; the first wave of buyers arrives spread
   over a few seconds (real clients: retries, Retry-After, instance switching);
2. once orders exist but the sale is not over (polled in PostgreSQL), the
   fault runs; the sale must have been neither over before it nor stopped by it.
   Once the fault is over, the buyers of the wave yet to arrive come at once
   (the driver's hurry): what follows the fault is the recovery, which a
   spread of arrivals only stretches in time;
3. after the wave: every client has a final answer (201 or ``sold_out``), the
   invariants hold (no oversell, no user twice, stock adds up, every 201 has
   its row with that order id, nobody told "no" has an order), and the audit
   finds no failure;
4. reconciliation: the ledger empties and Redis agrees with the database;
5. a second wave of new buyers, larger than what is left, after which the whole
   stock is sold (nothing lost), the invariants hold over both waves, and the
   audit is clean.

Each finished scenario adds one line to
:data:`tests.chaos.reporting.REPORT_LINES`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from gateway.ops.audit import Finding, SkuAudit
from testkit.driver import ClientPolicy, DriverSummary, LoadDriver
from testkit.invariants import InvariantReport, check_invariants
from testkit.polling import GaveUp, wait_for
from tests.chaos.checks import FINAL_ANSWERS, explain, quiesce, unfinished
from tests.chaos.reporting import REPORT_LINES
from tests.chaos.stacks import Stack

# Settings every scenario starts from: batches that take a while to fill (so a
# fault finds reservations in flight), reconciliation fast enough for a test.
BASE_SETTINGS: dict[str, str | int | float] = {
    "batch_wait_ms": 50,
    "batch_max": 64,
    "reservation_timeout_s": 1,
    "reconcile_interval_s": 0.2,
    "lock_lease_s": 1,
}
SKU = "flash"


def settings_for(lock: str, **overrides: str | int | float) -> dict[str, str | int | float]:
    """Gateway settings of a scenario: the base, the flush lock, then ``overrides``."""
    return {**BASE_SETTINGS, "flush_lock": lock, **overrides}


# --------------------------------------------------------------------------- the sale


@dataclass(frozen=True)
class SalePlan:
    """How a scenario's first wave goes: ``users`` buyers for ``stock`` units,
    arriving over ``spread_s`` seconds; the fault runs once ``trigger`` of the
    stock is sold (and ``ready``, if given, says yes)."""

    stock: int = 100
    users: int = 170
    spread_s: float = 3.0
    trigger: float = 0.2
    seed: int = 1
    policy: ClientPolicy | None = None


# A fault: runs against the stack mid-sale; returns what it did, for the report line.
Fault = Callable[[Stack, str], Awaitable[str]]


@dataclass
class ScenarioRun:
    """What happened in one scenario, for the test's own extra assertions."""

    name: str
    stack: Stack
    sku: str
    plan: SalePlan
    fault: str = ""
    orders_at_fault: int = 0
    first: DriverSummary | None = None
    second: DriverSummary | None = None
    first_report: InvariantReport | None = None
    report: InvariantReport | None = None
    audits: list[SkuAudit] = field(default_factory=list)
    elapsed_s: float = 0.0

    def line(self) -> str:
        """The report line of the whole scenario (both waves)."""
        assert self.report is not None
        return f"{self.report.line()} | {self.elapsed_s:.1f}s"


async def run_scenario(
    stack: Stack,
    name: str,
    fault: Fault,
    plan: SalePlan | None = None,
    *,
    sku: str = SKU,
    ready: Callable[[], Awaitable[bool]] | None = None,
) -> ScenarioRun:
    """Run the sale of the module docstring with ``fault`` in its middle; every check
    of steps 3 to 5 is asserted here. Returns the run for further assertions."""
    plan = plan or SalePlan()
    run = ScenarioRun(name, stack, sku, plan)
    started = time.monotonic()
    await stack.gateways.put_sku(sku, plan.stock)
    fault_over = asyncio.Event()
    driver = LoadDriver(
        stack.gateways.urls,
        sku,
        users=plan.users,
        start_spread_s=plan.spread_s,
        seed=plan.seed,
        policy=plan.policy,
        run_id=f"w1{uuid.uuid4().hex[:4]}",
        hurry=fault_over,
    )
    sale = asyncio.create_task(driver.run())
    try:
        run.orders_at_fault = await _mid_sale(stack, sku, plan, sale, ready)
        run.fault = await fault(stack, sku)
        fault_over.set()
        async with asyncio.timeout(90):
            run.first = await sale
        await _check_first_wave(run)
        await _second_wave(run)
    except BaseException as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        REPORT_LINES.append(f"{name} | {run.fault or 'fault not done'} | FAILED: {first_line}")
        raise
    finally:
        if not sale.done():
            sale.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sale
    run.elapsed_s = time.monotonic() - started
    REPORT_LINES.append(run.line())
    return run


async def _mid_sale(
    stack: Stack,
    sku: str,
    plan: SalePlan,
    sale: asyncio.Task[DriverSummary],
    ready: Callable[[], Awaitable[bool]] | None,
) -> int:
    """Wait until ``trigger`` of the stock is sold (and ``ready``); the order count.

    Fails if the sale ends first: a fault after the sale would prove nothing.
    """
    threshold = max(1, int(plan.stock * plan.trigger))

    async def reached() -> tuple[int] | None:
        if sale.done():
            raise GaveUp("the first wave ended before the fault could run")
        orders = await stack.orders(sku)
        if orders < threshold or (ready is not None and not await ready()):
            return None
        return (orders,)

    (orders,) = await wait_for(
        reached, within=30, what="the sale to reach the fault", interval=0.02
    )
    assert orders < plan.stock, f"sale already over ({orders} orders) before the fault"
    return orders


async def _check_first_wave(run: ScenarioRun) -> None:
    stack, first = run.stack, run.first
    assert first is not None
    context = f"{run.name} ({run.fault})"
    assert not first.unresolved, (
        f"{context}: {len(first.unresolved)} clients never got an answer: {unfinished(first)}"
    )
    assert set(first.counts) <= FINAL_ANSWERS, (
        f"{context}: unexpected answers {first.counts}: {unfinished(first)}"
    )
    # Checked at once (the answers are in), then again once reconciled.
    report = await check_invariants(
        stack.database_url, run.sku, run.plan.stock, first, scenario=run.name, faults=run.fault
    )
    if report.problems(allow_lost=True):
        story = await explain(stack, report, [first])
        raise AssertionError(f"{context} first wave:\n{report}\n{story}")
    row = await quiesce(stack, run.sku)
    run.audits.append(row)
    assert not row.failed, f"{context}: audit after the first wave: {row}"
    report = await check_invariants(
        stack.database_url, run.sku, run.plan.stock, first, scenario=run.name, faults=run.fault
    )
    run.first_report = report
    if report.problems(allow_lost=True):
        story = await explain(stack, report, [first])
        raise AssertionError(f"{context} first wave, reconciled:\n{report}\n{story}")
    assert report.sold > run.orders_at_fault, (
        f"{context}: no order after the fault ({report.sold} sold, "
        f"{run.orders_at_fault} before it): the sale did not go on"
    )


async def _second_wave(run: ScenarioRun) -> None:
    stack, first = run.stack, run.first
    assert first is not None and run.first_report is not None
    context = f"{run.name} ({run.fault})"
    remaining = run.plan.stock - run.first_report.sold
    users = [f"late-{i}" for i in range(2 * remaining + 10)]
    second = await LoadDriver(
        stack.live_urls(),
        run.sku,
        users=users,
        start_spread_s=0.5,
        seed=run.plan.seed + 1,
        run_id=f"w2{uuid.uuid4().hex[:4]}",
    ).run()
    run.second = second
    assert not second.unresolved, f"{context}: second wave unresolved: {unfinished(second)}"
    assert set(second.counts) <= FINAL_ANSWERS, (
        f"{context}: second wave answers {second.counts}: {unfinished(second)}"
    )
    row = await quiesce(stack, run.sku)
    run.audits.append(row)
    report = await check_invariants(
        stack.database_url,
        run.sku,
        run.plan.stock,
        [first, second],
        scenario=run.name,
        faults=run.fault,
    )
    run.report = report
    if not report.ok:
        story = await explain(stack, report, [first, second])
        raise AssertionError(f"{context}:\n{report}\n{story}")
    assert report.sold == run.plan.stock, f"{context}: stock left unsold:\n{report}"
    assert row.verdict == Finding.OK, f"{context}: audit after the second wave: {row}"


# Each scenario runs with the flush lock on (redis) and off (none).
LOCKS = pytest.mark.parametrize("lock", ["redis", "none"])
