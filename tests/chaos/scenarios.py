"""Plumbing of the chaos scenarios: topologies, one sale with a fault in its middle, checks.

A scenario (``tests/chaos/test_scenarios.py``) builds a :class:`Stack` (two
gateway subprocesses on one private Redis and one private PostgreSQL database,
each behind a :class:`FaultProxy`, or on a Sentinel-watched Redis pair), then
calls :func:`run_scenario` with a fault. That runs the sale the same way every
time:

1. a sku with less stock than buyers; the first wave of buyers arrives spread
   over a few seconds (real clients: retries, Retry-After, instance switching);
2. once orders exist but the sale is not over (polled in PostgreSQL), the
   fault runs; the sale must have been neither over before it nor stopped by it;
3. after the wave: every client has a final answer (201 or ``sold_out``), the
   invariants hold (no oversell, no user twice, stock adds up, every 201 has
   its row with that order id, nobody told "no" has an order), and the audit
   finds no failure;
4. reconciliation: the ledger empties and Redis agrees with the database;
5. a second wave of new buyers, larger than what is left, after which the whole
   stock is sold (nothing lost), the invariants hold over both waves, and the
   audit is clean.

Each finished scenario adds one line to :data:`REPORT_LINES`, printed in the
terminal summary by ``tests/chaos/conftest.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncpg

from gateway.audit import Finding, SkuAudit, audit
from gateway.layout import SkuKeys
from gateway.settings import Settings
from tests.chaos.conftest import Diagnostics
from tests.chaos.driver import CONFIRMED, SOLD_OUT, ClientPolicy, DriverSummary, LoadDriver
from tests.chaos.gateways import Gateway, GatewayCluster
from tests.chaos.invariants import InvariantReport, check_invariants
from tests.chaos.proxy import FaultProxy
from tests.chaos.servers import (
    Address,
    GaveUp,
    PostgresCluster,
    RedisSentinelCluster,
    RedisServer,
    redis_client,
    wait_for,
)

# One line per finished scenario; tests/chaos/conftest.py prints them at the end.
REPORT_LINES: list[str] = []

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
# The only final answers a first-wave buyer may get: each buys once, with one request id.
FINAL_ANSWERS = {CONFIRMED, SOLD_OUT}


def settings_for(lock: str, **overrides: str | int | float) -> dict[str, str | int | float]:
    """Gateway settings of a scenario: the base, the flush lock, then ``overrides``."""
    return {**BASE_SETTINGS, "flush_lock": lock, **overrides}


# --------------------------------------------------------------------------- topology


@dataclass
class Stack:
    """Two gateways, the servers behind them, and direct ways to look at those servers."""

    gateways: GatewayCluster
    pg: PostgresCluster
    # Direct (not proxied) URL of the scenario's database, for the checks.
    database_url: str
    pg_proxy: FaultProxy
    redis_server: RedisServer | None = None
    redis_proxy: FaultProxy | None = None
    sentinel: RedisSentinelCluster | None = None

    @property
    def key_prefix(self) -> str:
        """The gateways' Redis key prefix."""
        return self.gateways.key_prefix

    @property
    def lock(self) -> str:
        """The flush lock the gateways use (``redis``, ``postgres`` or ``none``)."""
        return self.gateways.env.get("GATEWAY_FLUSH_LOCK", "redis")

    @property
    def lease_s(self) -> float:
        """The gateways' lock lease."""
        return float(self.gateways.env.get("GATEWAY_LOCK_LEASE_S", "10"))

    def keys(self, sku: str) -> SkuKeys:
        """The sku's Redis keys under the gateways' prefix."""
        return SkuKeys.of(self.key_prefix, sku)

    def lock_key(self, sku: str) -> str:
        """The Redis key of the sku's flush lock (a hash: owner, count, fence)."""
        return f"{self.key_prefix}:{{{sku}}}:lock"

    async def redis_address(self) -> Address:
        """The Redis data node the gateways write to, reached directly (no proxy)."""
        if self.sentinel is not None:
            return await self.sentinel.master_address()
        assert self.redis_server is not None
        return self.redis_server.address

    async def audit_settings(self) -> Settings:
        """Settings for :func:`gateway.audit.audit` on these servers, read directly."""
        host, port = await self.redis_address()
        return Settings(
            redis_url=f"redis://{host}:{port}/0",
            database_url=self.database_url,
            key_prefix=self.key_prefix,
        )

    async def audit(self, sku: str) -> SkuAudit:
        """The audit row of ``sku``."""
        rows = await audit(await self.audit_settings(), sku)
        assert len(rows) == 1, rows
        return rows[0]

    async def orders(self, sku: str) -> int:
        """Order rows of ``sku`` (PostgreSQL, directly)."""
        con = await asyncpg.connect(self.database_url, timeout=2)
        try:
            count: int = await con.fetchval(
                "SELECT count(*) FROM orders WHERE sku = $1", sku, timeout=2
            )
            return count
        finally:
            await con.close(timeout=2)

    async def ledger(self, sku: str) -> dict[str, str]:
        """The pending ledger of ``sku``: request id -> ``user|qty|reserved_at_ms``."""
        async with redis_client(await self.redis_address()) as r:
            entries = await r.hgetall(self.keys(sku).pending)
        return {str(k): str(v) for k, v in entries.items()}

    def live_urls(self) -> list[str]:
        """Base URLs of the gateways that are running now."""
        return [g.url for g in self.gateways if g.running]


def log_digest(gateways: GatewayCluster, lines: int = 60) -> str:
    """The end of every gateway's log without its per-request failure lines (a
    fault makes hundreds), which are only counted."""
    parts = []
    for g in gateways:
        text = g.log_text().splitlines()
        kept = [line for line in text if '"request_failed"' not in line]
        parts.append(
            f"--- gateway {g.index} (port {g.port}, pid {g.pid}, rc {g.returncode}),"
            f" {len(text) - len(kept)} request_failed lines left out\n" + "\n".join(kept[-lines:])
        )
    return "\n".join(parts)


def log_events(gateway: Gateway, event: str) -> list[dict[str, Any]]:
    """Every JSON log record of ``gateway`` whose event is ``event``."""
    found = []
    for line in gateway.log_text().splitlines():
        if f'"{event}"' in line and line.startswith("{"):
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("event") == event:
                    found.append(record)
    return found


async def redis_state(stack: Stack, sku: str = "flash") -> str:
    """The sku's flush lock (owner, the gateway whose pid it names, count, fence,
    PTTL) and ledger size in Redis, for the report of a failed scenario."""
    key = stack.lock_key(sku)
    try:
        async with redis_client(await stack.redis_address()) as r:
            lock = await r.hgetall(key)
            pttl = await r.pttl(key)
            pending = await r.hlen(stack.keys(sku).pending)
            stock = await r.get(stack.keys(sku).stock)
    except Exception as exc:
        return f"--- redis state: unreadable ({exc!r})"
    fields = {str(_text(k)): _text(v) for k, v in lock.items()}
    owner = fields.get("owner")
    holders = [f"gw{g.index}" for g in stack.gateways if g.pid == pid_of(owner)]
    return (
        f"--- redis state of {sku!r}: lock {fields or 'free'} pttl {pttl}ms held by"
        f" {holders or 'no running gateway'}; stock {stock!r}; ledger {pending} entries"
    )


async def freeze_stack(stack: Stack, diagnostics: Diagnostics) -> None:
    """On failure: read Redis's view of the sku, then every diagnostic (see freeze)."""
    state = await redis_state(stack)
    diagnostics.append(_constant(state))
    freeze(diagnostics)


def freeze(diagnostics: Diagnostics) -> None:
    """Read every diagnostic now: the stack is about to remove its logs, and the
    report of a failed test is written after the test body (and the stack) ended."""
    texts = []
    for source in diagnostics:
        try:
            texts.append(source())
        except Exception as exc:
            texts.append(f"(diagnostic failed: {exc!r})")
    diagnostics[:] = [_constant(text) for text in texts]


def _constant(text: str) -> Callable[[], str]:
    return lambda: text


async def database_on(pg: PostgresCluster) -> str:
    """A new, empty database on ``pg`` (restarted first if a scenario left it down)."""
    if not pg.running:
        await pg.start()
    await pg.wait_ready(within=30)
    name = f"chaos_{uuid.uuid4().hex[:10]}"
    await pg.create_database(name)
    return name


@contextlib.asynccontextmanager
async def proxied_stack(
    pg: PostgresCluster,
    diagnostics: Diagnostics,
    settings: Mapping[str, str | int | float],
    count: int = 2,
) -> AsyncIterator[Stack]:
    """A private Redis and a new database on ``pg``, each behind a fault proxy, and
    ``count`` gateways reaching both through the proxies."""
    dbname = await database_on(pg)
    async with RedisServer() as redis_server:
        diagnostics.append(lambda: f"--- redis {redis_server.port}\n{redis_server.log_tail()}")
        with (
            FaultProxy(*redis_server.address, name="redis") as redis_proxy,
            FaultProxy(*pg.address, name="postgres") as pg_proxy,
        ):
            gateways = GatewayCluster(
                count,
                redis_url=redis_server.url(address=redis_proxy.address),
                database_url=pg.url(dbname, address=pg_proxy.address),
                settings=settings,
            )
            diagnostics.append(lambda: log_digest(gateways))
            async with gateways:
                stack = Stack(
                    gateways=gateways,
                    pg=pg,
                    database_url=pg.url(dbname),
                    pg_proxy=pg_proxy,
                    redis_server=redis_server,
                    redis_proxy=redis_proxy,
                )
                try:
                    yield stack
                except BaseException:
                    await freeze_stack(stack, diagnostics)
                    raise


@contextlib.asynccontextmanager
async def sentinel_stack(
    pg: PostgresCluster,
    diagnostics: Diagnostics,
    settings: Mapping[str, str | int | float],
    count: int = 2,
) -> AsyncIterator[Stack]:
    """A Redis primary, its replica and three Sentinels; gateways that follow the
    primary the Sentinels name. Sentinels hand out the data nodes' real addresses,
    so Redis is reached directly; PostgreSQL still goes through a proxy."""
    dbname = await database_on(pg)
    async with RedisSentinelCluster() as sentinel:
        diagnostics.append(sentinel.log_tails)
        sentinels = ",".join(f"{h}:{p}" for h, p in sentinel.sentinel_addresses())
        primary = await sentinel.primary()
        with FaultProxy(*pg.address, name="postgres") as pg_proxy:
            gateways = GatewayCluster(
                count,
                # Ignored while GATEWAY_REDIS_SENTINELS is set.
                redis_url=primary.url(),
                database_url=pg.url(dbname, address=pg_proxy.address),
                settings={
                    **settings,
                    "redis_sentinels": sentinels,
                    "redis_sentinel_master": sentinel.master_name,
                },
            )
            diagnostics.append(lambda: log_digest(gateways))
            async with gateways:
                stack = Stack(
                    gateways=gateways,
                    pg=pg,
                    database_url=pg.url(dbname),
                    pg_proxy=pg_proxy,
                    sentinel=sentinel,
                )
                try:
                    yield stack
                except BaseException:
                    await freeze_stack(stack, diagnostics)
                    raise


# --------------------------------------------------------------------------- metrics


async def scrape(gateway: Gateway, within: float = 3.0) -> dict[str, float]:
    """The gateway's /metrics as {sample name with labels: value}."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=within)) as http,
        http.get(f"{gateway.url}/metrics") as response,
    ):
        text = await response.text()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def metric(samples: Mapping[str, float], name: str) -> float:
    """Sum of every sample of ``name`` (all label sets)."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


async def metric_total(stack: Stack, name: str) -> float:
    """Sum of ``name`` over every running gateway (counters restart with a process)."""
    total = 0.0
    for gateway in stack.gateways:
        if gateway.running:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                total += metric(await scrape(gateway), name)
    return total


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
    driver = LoadDriver(
        stack.gateways.urls,
        sku,
        users=plan.users,
        start_spread_s=plan.spread_s,
        seed=plan.seed,
        policy=plan.policy,
        run_id=f"w1{uuid.uuid4().hex[:4]}",
    )
    sale = asyncio.create_task(driver.run())
    try:
        run.orders_at_fault = await _mid_sale(stack, sku, plan, sale, ready)
        run.fault = await fault(stack, sku)
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


def _unfinished(summary: DriverSummary) -> str:
    """Clients without an allowed final answer, with what they saw last."""
    odd = [r for r in summary.records if r.outcome not in FINAL_ANSWERS]
    return "; ".join(f"{r.request_id}: {r.outcome} ({r.last()})" for r in odd[:5])


async def _check_first_wave(run: ScenarioRun) -> None:
    stack, first = run.stack, run.first
    assert first is not None
    context = f"{run.name} ({run.fault})"
    assert not first.unresolved, (
        f"{context}: {len(first.unresolved)} clients never got an answer: {_unfinished(first)}"
    )
    assert set(first.counts) <= FINAL_ANSWERS, (
        f"{context}: unexpected answers {first.counts}: {_unfinished(first)}"
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
    assert not second.unresolved, f"{context}: second wave unresolved: {_unfinished(second)}"
    assert set(second.counts) <= FINAL_ANSWERS, (
        f"{context}: second wave answers {second.counts}: {_unfinished(second)}"
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


# --------------------------------------------------------------------------- faults


def pid_of(owner: str | None) -> int | None:
    """The pid at the start of a lock owner id ``<pid>:<random>:<serial>``."""
    if not owner:
        return None
    head = owner.split(":", 1)[0]
    return int(head) if head.isdigit() else None


@dataclass
class HolderStop:
    """A gateway stopped (SIGSTOP) while it held the sku's flush lock."""

    gateway: Gateway
    owner: str
    fence_before: int
    fence_after: int
    owners_seen: set[str]
    stopped_s: float
    # Orders committed while the holder was stopped (by the other instance).
    orders_meanwhile: int = 0

    @property
    def taken_over(self) -> bool:
        """Whether someone acquired the lock while the holder was stopped."""
        return self.fence_after > self.fence_before


async def stop_lock_holder(
    stack: Stack, sku: str, *, stop_s: float, within: float = 15.0
) -> HolderStop:
    """Find the gateway holding ``sku``'s flush lock and SIGSTOP it for ``stop_s``.

    Polls ``HGET <lock> owner`` until it names a gateway's pid, stops that
    gateway, and keeps it stopped only if the lock is still its own 50 ms
    later (a release already on the wire would have landed by then);
    otherwise it resumes it and tries again. While the holder is stopped the
    fence counter is read before and after: it only grows when someone
    acquires, so growth shows the lease ran out and another instance took over.
    """
    key = stack.lock_key(sku)
    deadline = time.monotonic() + within
    async with redis_client(await stack.redis_address(), within=2) as r:
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no gateway caught holding {key} within {within}s")
            owner = _text(await r.hget(key, "owner"))
            pids = {g.pid: g for g in stack.gateways if g.running}
            gateway = pids.get(pid_of(owner))
            if gateway is None or owner is None:
                await asyncio.sleep(0.001)
                continue
            gateway.pause()
            stopped = time.monotonic()
            await asyncio.sleep(0.05)
            if _text(await r.hget(key, "owner")) == owner:
                break
            gateway.resume()
        try:
            fence_before = int(await r.get(key + ":fence") or 0)
            orders_before = await stack.orders(sku)
            seen: set[str] = set()
            while time.monotonic() - stopped < stop_s:
                current = _text(await r.hget(key, "owner"))
                if current:
                    seen.add(current)
                await asyncio.sleep(0.01)
            fence_after = int(await r.get(key + ":fence") or 0)
            meanwhile = await stack.orders(sku) - orders_before
        finally:
            gateway.resume()
    return HolderStop(
        gateway, owner, fence_before, fence_after, seen, time.monotonic() - stopped, meanwhile
    )


def _text(value: str | bytes | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def even_user(entry: str) -> bool:
    """Whether a ledger entry belongs to a first-wave buyer that started on gateway 0.

    The driver sends client ``i`` (``user-i``) first to gateway ``i % 2``.
    """
    user = entry.split("|", 1)[0]
    number = user.rpartition("-")[2]
    return user.startswith("user-") and number.isdigit() and int(number) % 2 == 0


def reserved_at_ms(entry: str) -> int:
    """When a ledger entry ``user|qty|reserved_at_ms`` was reserved."""
    return int(entry.rsplit("|", 1)[1])


def young_batch_on_gateway_0(
    stack: Stack, sku: str, younger_than_ms: float
) -> Callable[[], Awaitable[bool]]:
    """A ``ready`` condition: gateway 0 has reservations in the ledger, all younger
    than ``younger_than_ms``. Set that to half the batch wait and gateway 0's batch
    is filling with no flush of it due or running (a flush's entries would be
    older), so a signal sent now finds that batch queued."""

    async def ready() -> bool:
        mine = [e for e in (await stack.ledger(sku)).values() if even_user(e)]
        now_ms = time.time() * 1000
        return bool(mine) and all(now_ms - reserved_at_ms(e) < younger_than_ms for e in mine)

    return ready


async def sleep_fault(seconds: float) -> None:
    """The length of a fault (the only fixed sleeps of the scenarios)."""
    await asyncio.sleep(seconds)
