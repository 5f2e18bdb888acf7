"""Chaos scenarios: a real flash sale on two gateway processes, broken in its middle.

Every scenario runs :func:`tests.chaos.scenarios.run_scenario`: less stock than
buyers, a fault once some orders exist but the sale is not over, then the
invariants (no oversell, no user twice, stock adds up, every 201 has its row,
nobody told "no" holds an order), every client answered, the audit clean,
reconciliation to an empty ledger, and a second wave that sells the whole
stock. Each runs with the flush lock on (``redis``) and off (``none``): the
database guard alone must prevent overselling.

Servers are private (``tests/chaos/servers.py``): one PostgreSQL cluster for the
module (a new database per scenario), a Redis per scenario. The shared servers
on 6379 and 5432 are never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import asyncpg
import pytest
import pytest_asyncio

from gateway.audit import Finding, audit
from gateway.database import migrate
from gateway.settings import Settings
from tests.chaos.conftest import Diagnostics
from tests.chaos.driver import (
    CONFIRMED,
    TRANSPORT_ERRORS,
    Attempt,
    ClientPolicy,
    ClientRecord,
    DriverSummary,
)
from tests.chaos.invariants import check_invariants
from tests.chaos.scenarios import (
    REPORT_LINES,
    SKU,
    SalePlan,
    Stack,
    even_user,
    explain,
    log_events,
    metric,
    metric_total,
    proxied_stack,
    quiesce,
    run_scenario,
    scrape,
    sentinel_stack,
    settings_for,
    sleep_fault,
    stop_lock_holder,
    young_batch_on_gateway_0,
)
from tests.chaos.servers import PostgresCluster, RedisServer, command, redis_client, wait_for

LOCKS = pytest.mark.parametrize("lock", ["redis", "none"])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_pg() -> AsyncIterator[PostgresCluster]:
    """One private PostgreSQL cluster for the module; each scenario gets a new database."""
    async with PostgresCluster() as cluster:
        yield cluster


@pytest.fixture
async def pg(shared_pg: PostgresCluster, diagnostics: Diagnostics) -> PostgresCluster:
    """The module's cluster, running (a failed scenario may have left it down)."""
    diagnostics.append(lambda: f"--- postgres {shared_pg.port}\n{shared_pg.log_tail()}")
    if not shared_pg.running:
        await shared_pg.start()
    return shared_pg


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
                before = await stack.orders(sku)
                stack.gateways[0].pause()
                try:
                    await sleep_fault(2.0)
                    meanwhile.append(await stack.orders(sku) - before)
                finally:
                    stack.gateways[0].resume()
                return f"SIGSTOP gw0 2.0s (no lock), {meanwhile[0]} orders meanwhile"
            stop = await stop_lock_holder(stack, sku, stop_s=2.0)
            stops.append(stop)
            meanwhile.append(stop.orders_meanwhile)
            return (
                f"SIGSTOP lock holder gw{stop.gateway.index} {stop.stopped_s:.1f}s (lease 0.5s),"
                f" fence +{stop.fence_after - stop.fence_before},"
                f" {stop.orders_meanwhile} orders meanwhile"
            )

        await run_scenario(stack, f"2 lock expiry [{lock}]", pause_holder)
        assert meanwhile[0] > 0, "the other instance sold nothing while the first was stopped"
        if lock == "none":
            return
        (stop,) = stops
        assert stop.taken_over, f"nobody acquired the lock while its holder slept: {stop}"
        assert any(o != stop.owner for o in stop.owners_seen), stop

        async def learned() -> float:
            return metric(await scrape(stop.gateway), "flashsale_locks_lost_total")

        lost = await wait_for(learned, within=10, what="the stale holder counts a lost lock")
        assert lost >= 1


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


# --------------------------------------------------------------------------- 5. PostgreSQL


@pytest.mark.chaos
@pytest.mark.timeout(90)
@LOCKS
async def test_postgres_restarts_mid_sale(
    lock: str, pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """PostgreSQL restarts (fast shutdown) mid-sale: open connections break,
    flushes in progress fail with 503 and give their reservations back, clients
    retry, and the pools reconnect once it is back. Nothing confirmed is lost."""
    async with proxied_stack(pg, diagnostics, settings_for(lock)) as stack:

        async def restart(stack: Stack, sku: str) -> str:
            started = time.monotonic()
            await stack.pg.restart("fast")
            return f"postgres fast restart ({time.monotonic() - started:.1f}s)"

        await run_scenario(stack, f"5 postgres restart [{lock}]", restart)


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
    sale resumes and the whole stock sells."""
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


# --------------------------------------------------------------------------- 6. gateway dies


@pytest.mark.chaos
@pytest.mark.timeout(90)
@LOCKS
async def test_gateway_killed_with_batches_in_flight(
    lock: str, pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """Gateway 0 is SIGKILLed while its batch of reservations waits to flush
    (batch wait 400 ms): those reservations are orphaned in the ledger. Their
    buyers retry on gateway 1 (in_progress) until its reconciler settles them after
    the reservation timeout (stock and buyer given back); they buy again and the
    whole stock sells."""
    settings = settings_for(lock, batch_wait_ms=400, batch_max=1000)
    async with proxied_stack(pg, diagnostics, settings) as stack:
        orphaned = []

        async def sigkill(stack: Stack, sku: str) -> str:
            await stack.gateways[0].crash()
            left = [e for e in (await stack.ledger(sku)).values() if even_user(e)]
            orphaned.extend(left)
            return f"SIGKILL gw0 with {len(left)} reservations in its batch"

        ready = young_batch_on_gateway_0(stack, SKU, younger_than_ms=200)
        await run_scenario(stack, f"6 gateway SIGKILL [{lock}]", sigkill, ready=ready)
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
    within its drain bound (3 s); nobody is left without an answer."""
    settings = settings_for(lock, batch_wait_ms=300, batch_max=1000)
    async with proxied_stack(pg, diagnostics, settings) as stack:

        async def sigterm(stack: Stack, sku: str) -> str:
            gateway = stack.gateways[0]
            started = time.monotonic()
            gateway.kill(signal.SIGTERM)
            status = await gateway.wait_exit(within=10)
            took = time.monotonic() - started
            assert status == 0, f"gateway 0 exited {status}:\n{gateway.log_tail()}"
            assert took < 3 + 2, f"drain took {took:.1f}s, bound 3s"
            return f"SIGTERM gw0 with a batch queued, exit {status} after {took:.1f}s"

        ready = young_batch_on_gateway_0(stack, SKU, younger_than_ms=150)
        await run_scenario(stack, f"6 gateway SIGTERM [{lock}]", sigterm, ready=ready)
        (draining,) = log_events(stack.gateways[0], "draining")
        assert draining["queued"] >= 1, f"nothing was queued at SIGTERM: {draining}"


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
    status = await gateway.wait_exit(within=10)
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


# --------------------------------------------------------------------------- the harness bites


NAIVE_BUYERS = 30
NAIVE_STOCK = 10


async def _naive_purchase(
    url: str, sku: str, user: str, everyone_looked: asyncio.Barrier
) -> ClientRecord:
    """Check-then-act with no guard: read the stock, and if some is left take one."""
    record = ClientRecord(user, f"naive-{user}", 1)
    con = await asyncpg.connect(url)
    try:
        stock = await con.fetchval("SELECT stock FROM inventory WHERE sku = $1", sku)
        await everyone_looked.wait()  # every buyer saw stock before anyone takes it
        if stock > 0:
            async with con.transaction():
                # Deliberately unguarded (test-only code; tests/ is not scanned).
                await con.execute("UPDATE inventory SET stock = stock - 1 WHERE sku = $1", sku)
                record.order_id = await con.fetchval(
                    "INSERT INTO orders (request_id, sku, user_id, qty) VALUES ($1, $2, $3, 1)"
                    " RETURNING order_id::text",
                    record.request_id,
                    sku,
                    user,
                )
            record.outcome, record.status = CONFIRMED, 201
    finally:
        await con.close()
    return record


@pytest.mark.chaos
@pytest.mark.timeout(60)
async def test_harness_catches_oversell_when_the_guard_is_gone(
    pg: PostgresCluster, redis_server: RedisServer
) -> None:
    """The checks can fail: without the guard, 30 buyers take 10 units and both the
    invariants and the audit say so.

    The gateway's own flush cannot be made to oversell from outside (its UPDATE
    carries ``stock >= $n`` in its WHERE, and its code must not change), so this
    removes the floor at the database instead: in a private database, after the
    real migrations, the CHECK (stock >= 0) constraint is dropped, and a naive,
    test-only flush (check stock, then an unguarded ``stock = stock - 1`` plus an
    order insert, 30 concurrent buyers) plays the gateway without its guard. The
    same ``check_invariants`` and ``gateway.audit.audit`` the scenarios rely on
    must then report the oversell, the negative stock and a 201 without its row.
    """
    name = f"naive_{time.monotonic_ns()}"
    await pg.create_database(name)
    url = pg.url(name)
    con = await asyncpg.connect(url)
    try:
        await migrate(con)
        await con.execute("ALTER TABLE inventory DROP CONSTRAINT inventory_stock_check")
        await con.execute("INSERT INTO inventory (sku, stock) VALUES ('naive', $1)", NAIVE_STOCK)
        await con.execute(
            "INSERT INTO stock_movements (sku, delta, reason, stock_after)"
            " VALUES ('naive', $1, 'set', $1)",
            NAIVE_STOCK,
        )
    finally:
        await con.close()
    barrier = asyncio.Barrier(NAIVE_BUYERS)
    buyers = [_naive_purchase(url, "naive", f"user-{i}", barrier) for i in range(NAIVE_BUYERS)]
    async with asyncio.timeout(30):
        records = list(await asyncio.gather(*buyers))
    # A client told 201 whose row is missing: the false-confirmation check must bite.
    records.append(ClientRecord("ghost", "naive-ghost", 1, outcome=CONFIRMED, order_id="x"))
    summary = DriverSummary("naive", records, 0.0)
    report = await check_invariants(
        url, "naive", NAIVE_STOCK, summary, scenario="guard removed", faults="naive flush"
    )
    REPORT_LINES.append(report.line())
    assert report.oversell == NAIVE_BUYERS - NAIVE_STOCK, str(report)
    problems = report.problems()
    assert any(p.startswith("oversell") for p in problems), problems
    assert report.false_confirmations == ["naive-ghost"], problems
    assert not report.ok
    rows = await audit(Settings(redis_url=redis_server.url(), database_url=url), "naive")
    assert rows[0].verdict == Finding.OVERSOLD, rows
    assert Finding.NEGATIVE_STOCK in rows[0].findings, rows
    assert rows[0].failed


# --------------------------------------------------------------------------- two bugs, pinned down
#
# The scenarios above met these interleavings by chance (see the report of the
# run that found them); each test below forces one, so it fails every time the
# bug is there. A PostgreSQL session holding the sku's inventory row lock keeps
# a flush waiting inside PostgreSQL for as long as the test needs.


async def _attempt(
    http: aiohttp.ClientSession, urls: list[str], index: int, user: str, rid: str, within: float
) -> Attempt:
    """One purchase attempt on instance ``index``, recorded as the load driver does."""
    body = {"sku": SKU, "user_id": user, "request_id": rid}
    started = time.monotonic()
    attempt = Attempt(index, 0.0, 0.0, started_at=time.time())
    try:
        async with http.post(
            f"{urls[index]}/v1/purchase", json=body, timeout=aiohttp.ClientTimeout(total=within)
        ) as response:
            attempt.status = response.status
            attempt.body = await response.json(content_type=None)
    except TRANSPORT_ERRORS as exc:
        attempt.error = type(exc).__name__
    attempt.elapsed_s = time.monotonic() - started
    return attempt


def _note(record: ClientRecord, attempt: Attempt) -> None:
    """Add an attempt to ``record``; a final answer (not 503, not in_progress, not a
    transport error) becomes its outcome, as the load driver decides."""
    record.attempts.append(attempt)
    body = attempt.body if isinstance(attempt.body, dict) else {}
    if attempt.error or attempt.status == 503 or body.get("status") == "in_progress":
        return
    record.status, record.body, record.instance = attempt.status, attempt.body, attempt.instance
    if attempt.status == 201:
        record.outcome, record.order_id = CONFIRMED, body.get("order_id")
    elif attempt.status == 409:
        record.outcome = str(body.get("status"))
    else:
        record.outcome = f"http_{attempt.status}"


async def _until_final(http: aiohttp.ClientSession, urls: list[str], record: ClientRecord) -> None:
    """Retry like the load driver's clients (same request id, next instance) until a
    final answer, for 20 s at most."""
    deadline = time.monotonic() + 20
    while not record.final:
        assert time.monotonic() < deadline, f"{record.request_id}: no final answer: {record.last()}"
        await asyncio.sleep(0.1)
        index = len(record.attempts) % len(urls)
        _note(record, await _attempt(http, urls, index, record.user_id, record.request_id, 3.0))


@contextlib.asynccontextmanager
async def _row_locked(database_url: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Hold the sku's inventory row lock until the yielded ``release()`` is awaited."""
    con = await asyncpg.connect(database_url)
    tr = con.transaction()
    await tr.start()
    await con.execute("SELECT 1 FROM inventory WHERE sku = $1 FOR UPDATE", SKU)
    released = False

    async def release() -> None:
        nonlocal released
        if not released:
            released = True
            await tr.rollback()

    try:
        yield release
    finally:
        await release()
        await con.close()


async def _flush_waiting_on_row_lock(database_url: str) -> bool:
    """Whether a session (a gateway's flush: nothing else locks the row) waits on a lock."""
    con = await asyncpg.connect(database_url)
    try:
        waiting = await con.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
    finally:
        await con.close()
    return bool(waiting)


async def _check_records(
    stack: Stack, name: str, fault: str, provided: int, records: list[ClientRecord]
) -> None:
    """Reconciled, then the scenarios' invariants over these clients; one report line."""
    await quiesce(stack, SKU)
    summary = DriverSummary(SKU, records, 0.0)
    report = await check_invariants(
        stack.database_url, SKU, provided, summary, scenario=name, faults=fault
    )
    REPORT_LINES.append(report.line() if report.ok else f"{report.line()} | FAILED")
    if not report.ok:
        raise AssertionError(f"{report}\n{await explain(stack, report, [summary])}")


@pytest.mark.chaos
@pytest.mark.timeout(60)
@LOCKS
async def test_postgres_link_cut_after_the_flush_reached_postgres(
    lock: str, pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """A buyer whose flush outcome the gateway cannot know is never told "no" while
    its order commits. Forced: the victim's flush statement reaches PostgreSQL and
    waits on the row lock; the proxy cuts the link (the gateway sees the connection
    die); the row lock is let go and the orphaned statement commits the order.
    Meanwhile other buyers reserve what Redis has, and the victim retries. Stock 2.
    A gateway that takes the broken link for a failed flush answers 503 and gives
    the reservation back, the unit goes to another buyer and the victim's retry is
    told sold_out: "told no, but ordered". Keeping the reservation until the order
    rows tell (the reconciler can) gives the victim its 201."""
    async with proxied_stack(pg, diagnostics, settings_for(lock, batch_wait_ms=1)) as stack:
        await stack.gateways.put_sku(SKU, 2)
        urls = stack.gateways.urls
        victim = ClientRecord("victim", "cut-victim", 1)
        others = [ClientRecord(f"other-{i}", f"cut-other-{i}", 1) for i in range(2)]
        async with aiohttp.ClientSession() as http, _row_locked(stack.database_url) as release:
            first = asyncio.create_task(_attempt(http, urls, 0, "victim", victim.request_id, 10))
            await wait_for(
                lambda: _flush_waiting_on_row_lock(stack.database_url),
                within=10,
                what="the victim's flush waits on the row lock",
            )
            stack.pg_proxy.cut()
            _note(victim, await first)
            assert victim.attempts[0].status == 503, f"the cut failed no flush: {victim.last()}"
            tasks = {
                o.request_id: asyncio.create_task(
                    _attempt(http, urls, 0, o.user_id, o.request_id, 15)
                )
                for o in others
            }

            async def others_placed() -> bool:
                pending = await stack.ledger(SKU)
                return all(rid in pending or tasks[rid].done() for rid in tasks)

            await wait_for(others_placed, within=10, what="the other buyers reserved or answered")
            _note(victim, await _attempt(http, urls, 1, "victim", victim.request_id, 3.0))
            await release()
            await _until_final(http, urls, victim)
            for o in others:
                _note(o, await tasks[o.request_id])
                await _until_final(http, urls, o)
        await _check_records(
            stack,
            f"5b link cut mid-flush [{lock}]",
            "pg link cut under a waiting flush",
            2,
            [victim, *others],
        )
        assert victim.outcome == CONFIRMED, f"the orphaned statement did not commit: {victim}"


@pytest.mark.chaos
@pytest.mark.timeout(60)
async def test_reconciler_leaves_a_waiting_flush_alone(
    pg: PostgresCluster, diagnostics: Diagnostics
) -> None:
    """The reconciler never releases a reservation whose flush is still running,
    however slow (here: waiting on the inventory row lock for seconds, longer than
    GATEWAY_RESERVATION_TIMEOUT_S=1). Forced without a flush lock: the victim's
    flush waits in PostgreSQL; its client gives up on the attempt after 1 s; a
    reconciler that takes the old entry for abandoned gives the stock and buyer
    back, another buyer reserves the unit, the victim's retry is told sold_out,
    and then the waiting flush commits the victim's order: "told no, but
    ordered". Stock 1. (With the Redis lock the flusher holds the lock while its
    statement waits, so no reconciler runs in this interleaving.)"""
    async with proxied_stack(pg, diagnostics, settings_for("none", batch_wait_ms=1)) as stack:
        await stack.gateways.put_sku(SKU, 1)
        urls = stack.gateways.urls
        victim = ClientRecord("victim", "slow-victim", 1)
        other = ClientRecord("other", "slow-other", 1)
        async with aiohttp.ClientSession() as http, _row_locked(stack.database_url) as release:
            # The victim's client gives up on its first attempt after 1 s, like a real
            # client with a short timeout, and retries later with the same request id.
            first = asyncio.create_task(_attempt(http, urls, 0, "victim", victim.request_id, 1.0))
            await wait_for(
                lambda: _flush_waiting_on_row_lock(stack.database_url),
                within=10,
                what="the victim's flush waits on the row lock",
            )

            async def released() -> bool:
                return victim.request_id not in await stack.ledger(SKU)

            # A correct gateway never releases it: then this wait just runs out.
            with contextlib.suppress(TimeoutError):
                await wait_for(released, within=3, what="the reconciler releases the victim")
            _note(victim, await first)
            second = asyncio.create_task(_attempt(http, urls, 1, "other", other.request_id, 15))

            async def placed() -> bool:
                return second.done() or other.request_id in await stack.ledger(SKU)

            await wait_for(placed, within=10, what="the other buyer reserved or answered")
            _note(victim, await _attempt(http, urls, 1, "victim", victim.request_id, 3.0))
            await release()
            await _until_final(http, urls, victim)
            _note(other, await second)
            await _until_final(http, urls, other)
        await _check_records(
            stack,
            "3b slow flush vs reconciler [none]",
            "flush waits >1s on the row lock",
            1,
            [victim, other],
        )
        assert victim.outcome == CONFIRMED, f"the victim's waiting flush lost its unit: {victim}"
