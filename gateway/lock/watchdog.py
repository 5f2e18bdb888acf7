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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from gateway.lock.holds import Hold
from gateway.lock.metrics import LockMetrics

R = TypeVar("R")

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Watchdog(Generic[R]):
    """Keeps holds of one lock alive; the lock hands it three callbacks.

    ``renew`` asks the backend to extend a hold's lease (False: not ours any
    more; raises when unreachable); ``lose`` declares a hold lost and cancels its
    owner; ``expire`` ends an abandoned hold whose lease ran out.
    """

    name: str
    lease: float
    max_hold: float | None
    metrics: LockMetrics
    renew: Callable[[Hold[R]], Awaitable[bool]]
    lose: Callable[[Hold[R]], None]
    expire: Callable[[Hold[R]], Awaitable[None]]

    async def watch(self, hold: Hold[R]) -> None:
        """Keep ``hold`` alive while it is wanted; the body of every hold's watchdog task."""
        try:
            if await self._renew_while_wanted(hold):
                await self._run_out(hold)
        except Exception:  # a bug here must not leave a holder believing it holds
            log.exception("lock watchdog failed: %s", self.name)
            self.lose(hold)

    async def _renew_while_wanted(self, hold: Hold[R]) -> bool:
        """True when renewal stops by design (owner ended, max_hold passed); False when
        the hold ended or was lost."""
        period = self.lease / 3
        stop_at = float("inf") if self.max_hold is None else hold.acquired_at + self.max_hold
        while True:
            await _sleep_until(min(hold.renewed_at + period, stop_at))
            if not hold.live:
                return False
            if hold.task.done() or time.monotonic() >= stop_at:
                return True
            if not await self._renew_before_deadline(hold, period):
                return False

    async def _renew_before_deadline(self, hold: Hold[R], period: float) -> bool:
        while hold.live:
            sent = time.monotonic()
            left = hold.deadline - sent
            if left <= 0:
                break
            try:
                # Each try gets at most a period, so a hung call leaves time for more tries.
                async with asyncio.timeout(min(left, period)):
                    ours = await self.renew(hold)
            except Exception:  # unreachable, slow or failing: retry until the deadline
                self.metrics.renewal_failed()
                await asyncio.sleep(max(0.0, min(period / 4, hold.deadline - time.monotonic())))
                continue
            if not ours:
                if hold.closing:  # the final release got there first
                    return False
                break
            hold.renewed_at, hold.deadline = sent, sent + self.lease
            self.metrics.renewed()
            return True
        self.lose(hold)
        return False

    async def _run_out(self, hold: Hold[R]) -> None:
        """Renewal has stopped: the hold ends when its lease runs out."""
        await _sleep_until(hold.deadline)
        if not hold.live:
            return
        if hold.task.done():  # abandoned: nobody left to tell
            await self.expire(hold)
        else:  # max_hold passed: the holder must hear it
            self.lose(hold)


async def _sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
