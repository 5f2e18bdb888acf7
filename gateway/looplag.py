"""The event loop's lag: how late it ran a timer, and what held it when it stalled.

A gateway answers every buyer from one loop, so a call that blocks it (a
library running threads with their own loops around our connections, a
synchronous network or disk wait, a long collection) stalls every request in
flight at once. :class:`LoopLag` measures that from inside: a timer due every
``interval_s`` records how late it fired. When a stall outlasts
``stall_report_s``, a thread that watches the timer's heartbeat logs the
loop thread's stack *while it is still stuck*, which names the blocking call;
after the fact the lag alone could not.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

INTERVAL_S = 0.1
# Innermost frames of a stalled loop's stack put in the log line.
STACK_FRAMES = 12


class LoopLag:
    """Records the loop's lag every ``interval_s``; reports stalls past ``stall_report_s``
    (0: no report, no thread)."""

    def __init__(
        self,
        observe: Callable[[float], None],
        *,
        interval_s: float = INTERVAL_S,
        stall_report_s: float = 0.0,
    ) -> None:
        self._observe = observe
        self._interval_s = interval_s
        self._stall_report_s = stall_report_s
        self._beat = time.monotonic()

    async def run(self) -> None:
        """Measure until cancelled."""
        loop = asyncio.get_running_loop()
        watcher = None
        if self._stall_report_s > 0:
            watcher = _StallWatcher(self, threading.get_ident(), self._stall_report_s)
            watcher.start()
        try:
            while True:
                due = loop.time() + self._interval_s
                await asyncio.sleep(self._interval_s)
                self._beat = time.monotonic()
                self._observe(max(0.0, loop.time() - due))
        finally:
            if watcher is not None:
                watcher.stop()

    @property
    def beat(self) -> float:
        """When the timer last fired (``time.monotonic()``)."""
        return self._beat


class _StallWatcher(threading.Thread):
    """Samples the loop thread's stack once per stall longer than ``threshold_s``.

    It only reads the heartbeat and, during a stall, the loop thread's frames;
    it never touches the loop or its objects."""

    def __init__(self, lag: LoopLag, loop_thread: int, threshold_s: float) -> None:
        super().__init__(name="loop-stall-watcher", daemon=True)
        self._lag = lag
        self._loop_thread = loop_thread
        self._threshold_s = threshold_s
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        reported = 0.0
        while not self._stopped.wait(self._threshold_s / 2):
            beat = self._lag.beat
            stalled = time.monotonic() - beat
            if stalled < self._threshold_s or beat == reported:
                continue
            reported = beat
            frame = sys._current_frames().get(self._loop_thread)
            stack = traceback.format_stack(frame)[-STACK_FRAMES:] if frame else []
            log.warning("event_loop_stalled", seconds=round(stalled, 3), stack="".join(stack))
