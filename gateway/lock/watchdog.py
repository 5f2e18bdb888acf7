"""The watchdog: renews a hold every lease/3 and decides when it is lost.

It stops renewing at the last release, when the owning task has ended, and at
``max_hold``; then the hold ends when its lease runs out. A renewal that finds the
lock gone or someone else's, or no successful renewal before the local deadline
(last successful renewal + lease), loses the hold.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, TypeVar

from gateway.lock.holds import Hold, HoldState

if TYPE_CHECKING:
    from gateway.lock.base import BaseLock

R = TypeVar("R")

log = logging.getLogger(__name__)


async def watch(lock: BaseLock[R], hold: Hold[R]) -> None:
    """Keep ``hold`` alive while it is wanted; the body of every hold's watchdog task."""
    try:
        if await _renew_while_wanted(lock, hold):
            await _run_out(lock, hold)
    except Exception:  # a bug here must not leave a holder believing it holds
        log.exception("lock watchdog failed: %s", lock.name)
        lock._declare_lost(hold, cancel=True)


async def _renew_while_wanted(lock: BaseLock[R], hold: Hold[R]) -> bool:
    """True when renewal stops by design (owner ended, max_hold passed); False when the
    hold ended or was lost."""
    period = lock.lease / 3
    stop_at = float("inf") if lock.max_hold is None else hold.acquired_at + lock.max_hold
    while True:
        await _sleep_until(min(hold.renewed_at + period, stop_at))
        if not hold.live:
            return False
        if hold.task.done() or time.monotonic() >= stop_at:
            return True
        if not await _renew_before_deadline(lock, hold, period):
            return False


async def _renew_before_deadline(lock: BaseLock[R], hold: Hold[R], period: float) -> bool:
    while hold.live:
        sent = time.monotonic()
        left = hold.deadline - sent
        if left <= 0:
            break
        try:
            # Each try gets at most a period, so a hung call leaves time for more tries.
            async with asyncio.timeout(min(left, period)):
                ours = await lock._renew(hold)
        except Exception:  # unreachable, slow or failing: retry until the deadline
            lock.metrics.renewal_failed()
            await asyncio.sleep(max(0.0, min(period / 4, hold.deadline - time.monotonic())))
            continue
        if not ours:
            if hold.closing:  # the final release got there first
                return False
            break
        hold.renewed_at, hold.deadline = sent, sent + lock.lease
        lock.metrics.renewed()
        return True
    lock._declare_lost(hold, cancel=True)
    return False


async def _run_out(lock: BaseLock[R], hold: Hold[R]) -> None:
    """Renewal has stopped: the hold ends when its lease runs out."""
    await _sleep_until(hold.deadline)
    if not hold.live:
        return
    if hold.task.done():  # abandoned: nobody left to tell
        hold.state = HoldState.ENDED
        lock._forget(hold)
        await lock._discard(hold)
    else:  # max_hold passed: the holder must hear it
        lock._declare_lost(hold, cancel=True)


async def _sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
