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
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

INTERVAL_S = 0.1
# The calling thread's scheduler statistics (a pread of it costs a few µs).
SCHEDSTAT = "/proc/thread-self/schedstat"
# Innermost frames of a stalled loop's stack put in the log line.
STACK_FRAMES = 12


class LoopLag:
    """Records the loop's lag every ``interval_s``; reports stalls past ``stall_report_s``
    (0: no report, no thread).

    Each lag is told to ``observe`` with its own part: the lag less the time the
    loop thread spent runnable but waiting for a CPU over the interval (Linux's
    ``/proc/thread-self/schedstat``). On a machine short of CPU a timer runs
    late through no fault of the process; a call that blocks or a long
    computation on the loop is the process's own. Where schedstat is missing
    the whole lag counts as its own.
    """

    def __init__(
        self,
        observe: Callable[[float, float], None],
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
        waited = _RunQueueWait()
        try:
            while True:
                due = loop.time() + self._interval_s
                before = waited.seconds()
                await asyncio.sleep(self._interval_s)
                self._beat = time.monotonic()
                lag = max(0.0, loop.time() - due)
                self._observe(lag, max(0.0, lag - (waited.seconds() - before)))
        finally:
            waited.close()
            if watcher is not None:
                watcher.stop()

    @property
    def beat(self) -> float:
        """When the timer last fired (``time.monotonic()``)."""
        return self._beat


class _RunQueueWait:
    """How long the calling thread has waited for a CPU, in all (0 where unknown)."""

    def __init__(self) -> None:
        try:
            # Opened by the loop's thread: the descriptor stays that thread's.
            self._fd: int | None = os.open(SCHEDSTAT, os.O_RDONLY)
        except OSError:
            self._fd = None

    def seconds(self) -> float:
        if self._fd is None:
            return 0.0
        # "<ns on a CPU> <ns waiting on a run queue> <timeslices>"
        return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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
