"""Faults that need aim: catching the flush lock's holder, and a batch in flight.

Simple faults (kill, restart, latency, stall) are inline in the scenarios;
these find the moment or the process a fault must hit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from gateway.domain.stock import Pending
from gateway.redis.layout import ledger, lock_key
from testkit.gateways import Gateway
from testkit.metrics import metric, scrape
from testkit.redis_servers import redis_client
from tests.chaos.stacks import Stack, pid_of, text_of


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
    stack: Stack,
    sku: str,
    *,
    stop_s: float,
    within: float = 15.0,
    lane: int | None = None,
    until_sold_s: float = 0.0,
) -> HolderStop:
    """Find the gateway holding ``sku``'s flush lock and SIGSTOP it for ``stop_s``;
    with ``lane``, a gateway's worker of that lane index (GATEWAY_WORKERS > 1)
    holding it.

    The holder is caught by :func:`_catch_holder`. While it is stopped the fence
    counter is read before and after: it only grows when someone acquires, so
    growth shows the lease ran out and another instance took over.

    With ``until_sold_s``, a holder whose lock was taken over stays stopped
    past ``stop_s``, up to that much longer, until an order of ``sku`` commits:
    on a loaded machine the taker's first flush can land after ``stop_s``
    (the lease runs out, then the taker must win a CPU to acquire and flush),
    and a scenario asserting the other instance sold meanwhile would then
    judge the machine, not the gateway.
    """
    key = lock_key(stack.key_prefix, sku)
    async with redis_client(await stack.redis_address(), within=2) as r:
        gateway, worker, owner, stopped = await _catch_holder(stack, r, key, within, lane)
        try:
            fence_before = int(await r.get(key + ":fence") or 0)
            orders_before = await stack.orders(sku)
            seen: set[str] = set()
            while time.monotonic() - stopped < stop_s:
                current = text_of(await r.hget(key, "owner"))
                if current:
                    seen.add(current)
                await asyncio.sleep(0.01)
            fence_after = int(await r.get(key + ":fence") or 0)
            meanwhile = await stack.orders(sku) - orders_before
            longest = time.monotonic() + until_sold_s
            while fence_after > fence_before and not meanwhile and time.monotonic() < longest:
                await asyncio.sleep(0.05)
                meanwhile = await stack.orders(sku) - orders_before
        finally:
            gateway.resume(worker)
    return HolderStop(
        gateway, owner, fence_before, fence_after, seen, time.monotonic() - stopped, meanwhile
    )


@dataclass
class HolderKill:
    """A gateway SIGKILLed while it held the sku's flush lock."""

    gateway: Gateway
    owner: str
    fence: int
    # Reservations in the ledger when it died: its batch in flight among them.
    pending: int


async def kill_lock_holder(stack: Stack, sku: str, *, within: float = 15.0) -> HolderKill:
    """Find the gateway holding ``sku``'s flush lock and SIGKILL it, holding it.

    Caught by :func:`_catch_holder` (stopped, the lock still its own), then
    killed while stopped: it dies where it stood, the lock's hash naming it
    until the lease runs out. A holder keeps the lock only while it flushes
    back to back, so with the database's link slowed it dies mid-flush.
    """
    key = lock_key(stack.key_prefix, sku)
    async with redis_client(await stack.redis_address(), within=2) as r:
        gateway, _, owner, _ = await _catch_holder(stack, r, key, within, lane=None)
        fence = int(await r.get(key + ":fence") or 0)
        pending = await r.hlen(stack.keys(sku).pending)
        await gateway.crash()  # SIGKILL ends a stopped process too
    return HolderKill(gateway, owner, fence, pending)


async def _catch_holder(
    stack: Stack, r: Redis, key: str, within: float, lane: int | None
) -> tuple[Gateway, int | None, str, float]:
    """SIGSTOP the gateway that holds the lock at ``key``, or with ``lane`` its
    worker of that lane index if it does: (the gateway, the worker's pid or
    None, the lock's owner id, when).

    Polls ``HGET <lock> owner`` until it names a gateway's (or a worker's) pid,
    stops that process, and keeps it stopped only if the lock is still its own
    50 ms later (a release already on the wire would have landed by then);
    otherwise it resumes it and tries again.
    """
    deadline = time.monotonic() + within
    # Read once: finding a gateway's workers walks /proc, too slow to poll.
    lanes = {}
    if lane is not None:
        lanes = {pid: g for g in stack.gateways if (pid := g.workers().get(lane)) is not None}
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no gateway caught holding {key} within {within}s")
        owner = text_of(await r.hget(key, "owner"))
        pids: dict[int | None, tuple[Gateway, int | None]]
        if lane is not None:
            pids = {pid: (g, pid) for pid, g in lanes.items() if g.running}
        else:
            pids = {g.pid: (g, None) for g in stack.gateways if g.running}
        found = pids.get(pid_of(owner))
        if found is None or owner is None:
            await asyncio.sleep(0.001)
            continue
        gateway, worker = found
        gateway.pause(worker)
        stopped = time.monotonic()
        await asyncio.sleep(0.05)
        if text_of(await r.hget(key, "owner")) == owner:
            return gateway, worker, owner, stopped
        gateway.resume(worker)


def first_sent_to(entry: Pending, gateway: int) -> bool:
    """Whether a ledger entry belongs to a first-wave buyer that started on ``gateway``
    (of two). The driver sends client ``i`` (``user-i``) first to gateway ``i % 2``."""
    number = entry.user_id.rpartition("-")[2]
    return entry.user_id.startswith("user-") and number.isdigit() and int(number) % 2 == gateway


def young_batch_on(
    stack: Stack, sku: str, younger_than_ms: float, gateway: int = 0
) -> Callable[[], Awaitable[bool]]:
    """A ``ready`` condition: ``gateway`` has reservations in the ledger, all younger
    than ``younger_than_ms``. Set that to half the batch wait and the gateway's batch
    is filling with no flush of it due or running (a flush's entries would be
    older), so a signal sent now finds that batch queued."""

    async def ready() -> bool:
        mine = [e for e in ledger(await stack.ledger(sku)) if first_sent_to(e, gateway)]
        now_ms = time.time() * 1000
        return bool(mine) and all(now_ms - e.reserved_at_ms < younger_than_ms for e in mine)

    return ready


def reserved_on(stack: Stack, sku: str, gateway: int = 0) -> Callable[[], Awaitable[bool]]:
    """A ``ready`` condition: ``gateway`` has reservations in the ledger, in a batch
    filling or being flushed (killed either way, they are orphaned). Under the
    Redis lock age is no guide: the holder keeps the lock while its next batch
    fills, so the other gateway's batch waits out that hold and is never young
    (``young_batch_on`` found none before the first wave ended, on a loaded run
    and on a quiet one)."""

    async def ready() -> bool:
        return any(first_sent_to(e, gateway) for e in ledger(await stack.ledger(sku)))

    return ready


def passed_into_young_batch(
    stack: Stack, sku: str, younger_than_ms: float, gateway: int = 0
) -> Callable[[], Awaitable[bool]]:
    """A ``ready`` condition for a gateway of several workers (gateway.write.lanes):
    its sku's owner was passed a purchase since the last poll and has flushed
    nothing since, its oldest reservation younger than ``younger_than_ms`` (a
    little under the batch wait: no flush of it due or running). So that
    purchase waits in the filling batch and the worker that passed it awaits
    the owner's answer.

    No flush in between: the gateway's oldest reservation was already there at
    the last poll (the ledger is read before the counter); else a pass into the
    batch before, flushed since, made a loaded run's fault miss. The age is the
    oldest's, which may be a batch's still being flushed, waiting for the
    flush lock: the next batch's oldest shows only after that, already aged by
    the wait, so a bound of half the batch wait left a loaded run no poll in
    time."""
    seen: list[tuple[float, float | None]] = []

    async def ready() -> bool:
        mine = [e for e in ledger(await stack.ledger(sku)) if first_sent_to(e, gateway)]
        oldest = min((e.reserved_at_ms for e in mine), default=None)
        young = oldest is not None and time.time() * 1000 - oldest < younger_than_ms
        passed = metric(await scrape(stack.gateways[gateway].url), "flashsale_lane_passed_total")
        fresh = bool(seen) and passed > seen[-1][0] and seen[-1][1] == oldest
        seen.append((passed, oldest))
        return fresh and young

    return ready


async def sleep_fault(seconds: float) -> None:
    """The length of a fault (the only fixed sleeps of the scenarios)."""
    await asyncio.sleep(seconds)
