"""Two interleavings the chaos scenarios met by chance, each forced here so that
its bug fails the test every time: a flush whose outcome the gateway cannot
know, and a reconciler racing a slow flush."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import asyncpg
import pytest

from testkit.driver import (
    CONFIRMED,
    TRANSPORT_ERRORS,
    Attempt,
    ClientRecord,
    DriverSummary,
)
from testkit.invariants import check_invariants
from testkit.polling import wait_for
from testkit.postgres_servers import PostgresCluster
from tests.chaos.checks import explain, quiesce
from tests.chaos.reporting import REPORT_LINES, Diagnostics
from tests.chaos.sale import LOCKS, SKU, settings_for
from tests.chaos.stacks import Stack, proxied_stack

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
