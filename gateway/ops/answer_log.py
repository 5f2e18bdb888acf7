"""Logging that does not grow with the load: failures sampled, answers summed up.

Under overload every shed purchase is a 503; a warning per 503 would make the
busiest gateway write the most, on the same core that should be answering. So
a failed request is logged in full (with its request id, sku and client) only
when no other was logged in the last ``interval_s``; the others are counted,
and :meth:`AnswerLog.run` logs one ``answers_summary`` line per interval with
what was answered since: sheds, 503s, 429s, sold-out answers, buyers gone
before their body arrived (``client_gone``) and the failure lines left out.
A quiet gateway still logs its one odd 503 as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import structlog

from gateway.ops.request_stats import RequestStats

log = structlog.get_logger(__name__)

SUMMARY_INTERVAL_S = 1.0
# The purchase outcomes the summary reports, as counted by RequestStats.
SUMMED_OUTCOMES = ("sold_out", "unavailable", "rate_limited", "client_gone")


class AnswerLog:
    """Samples per-request failure lines and sums up the answers given."""

    def __init__(
        self,
        stats: RequestStats,
        interval_s: float = SUMMARY_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stats = stats
        self._interval = interval_s
        self._clock = clock
        self._next_line = 0.0
        self._left_out = 0
        self._seen = self._totals()

    def failure(self, **fields: Any) -> None:
        """A request failed (5xx): log it unless another was logged this interval."""
        now = self._clock()
        if now < self._next_line:
            self._left_out += 1
            return
        self._next_line = now + self._interval
        log.warning("request_failed", **fields)

    def summary(self) -> dict[str, int] | None:
        """What was answered since the last summary, or None when nothing was."""
        totals = self._totals()
        delta = {name: totals[name] - self._seen[name] for name in totals}
        self._seen = totals
        delta["failures_not_logged"], self._left_out = self._left_out, 0
        return delta if any(delta.values()) else None

    async def run(self) -> None:
        """Log :meth:`summary` once per interval while there is something to say."""
        while True:
            await asyncio.sleep(self._interval)
            summary = self.summary()
            if summary is not None:
                log.info("answers_summary", seconds=self._interval, **summary)

    def _totals(self) -> dict[str, int]:
        outcomes = self._stats.outcomes
        totals = {name: outcomes.get(name, 0) for name in SUMMED_OUTCOMES}
        totals["shed"] = self._stats.shed
        return totals
