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
import gc
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import FrameType

import structlog

log = structlog.get_logger(__name__)

INTERVAL_S = 0.1
# The calling thread's scheduler statistics (a pread of it costs a few µs).
SCHEDSTAT = "/proc/thread-self/schedstat"
# Each CPU's time in clock ticks, steal among it (a pread of it costs ~20 µs).
PROC_STAT = "/proc/stat"
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# A loop thread on a CPU less than this share of a stall was asleep, not working.
POLLING_BUSY = 0.1
# Innermost frames of a stalled loop's stack put in the log line.
STACK_FRAMES = 12


class LoopLag:
    """Records the loop's lag every ``interval_s``; reports stalls past ``stall_report_s``
    (0: no report, no thread).

    Each lag is told to ``observe`` with its own part: the lag less the time the
    loop thread could not run over the interval (:class:`Unscheduled`: runnable
    but waiting for a CPU, or its virtual CPU held by the hypervisor). On a
    machine short of CPU a timer runs late through no fault of the process; a
    call that blocks or a long computation on the loop is the process's own.
    Where Linux's counters are missing the whole lag counts as its own.
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
            # The frame that drives the loop: the loop thread's innermost Python
            # frame whenever the loop runs its own code (on uvloop, C: its poll).
            driver = sys._getframe().f_back
            watcher = StallWatcher(self, driver, self._stall_report_s)
            watcher.start()
        unscheduled = Unscheduled()
        try:
            while True:
                due = loop.time() + self._interval_s
                unscheduled.since_last()
                await asyncio.sleep(self._interval_s)
                self._beat = time.monotonic()
                lag = max(0.0, loop.time() - due)
                self._observe(lag, max(0.0, lag - unscheduled.since_last()))
        finally:
            unscheduled.close()
            if watcher is not None:
                watcher.stop()

    @property
    def beat(self) -> float:
        """When the timer last fired (``time.monotonic()``)."""
        return self._beat


class Unscheduled:
    """Time the calling thread could not run through no fault of its own: its
    wait on the guest's run queue (``schedstat``) and, in a virtual machine,
    the time the hypervisor held a virtual CPU (``steal`` in ``/proc/stat``;
    of the CPU that lost most, since the thread may have run on either).

    Each unknown part counts 0. Steal is counted in clock ticks (10 ms); a
    wait on a run queue during steal may be counted twice, which only ever
    excuses a lag, never blames one.
    """

    def __init__(self, schedstat: str = SCHEDSTAT, stat: str = PROC_STAT) -> None:
        # Opened by the loop's thread: /proc/thread-self stays that thread's.
        self._fds = {path: _open(path) for path in (schedstat, stat)}
        self._schedstat, self._stat = schedstat, stat
        self._waited = self._read_waited()
        self._stolen = self._read_stolen()

    def since_last(self) -> float:
        """Seconds unscheduled since the previous call (or since created)."""
        waited, stolen = self._read_waited(), self._read_stolen()
        most = max(
            (now - before for now, before in zip(stolen, self._stolen, strict=False)), default=0
        )
        seconds = max(0.0, waited - self._waited) + max(0, most) / TICKS_PER_S
        self._waited, self._stolen = waited, stolen
        return seconds

    def _read(self, path: str) -> bytes | None:
        fd = self._fds[path]
        return None if fd is None else os.pread(fd, 16_384, 0)

    def _read_waited(self) -> float:
        text = self._read(self._schedstat)
        # "<ns on a CPU> <ns waiting on a run queue> <timeslices>"
        return 0.0 if text is None else int(text.split()[1]) / 1e9

    def _read_stolen(self) -> list[int]:
        text = self._read(self._stat)
        if text is None:
            return []
        # "cpuN user nice system idle iowait irq softirq steal ...", per CPU.
        return [
            int(line.split()[8])
            for line in text.splitlines()
            if line.startswith(b"cpu") and not line.startswith(b"cpu ")
        ]

    def close(self) -> None:
        for fd in self._fds.values():
            if fd is not None:
                os.close(fd)
        self._fds = dict.fromkeys(self._fds)


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None


class StallWatcher(threading.Thread):
    """Samples the loop thread's stack once per stall longer than ``threshold_s``.

    It only reads the heartbeat and, during a stall, the loop thread's frames,
    its CPU time and whether the collector is running; it never touches the
    loop or its objects. Created by the loop's thread.

    A stall is logged ``polling`` when the loop thread was in the loop's own
    code (no frame of ours above ``driver``) and nearly off the CPU since the
    watcher's last look, taken on time: asleep in its poll past its timer
    while this thread ran, which only the machine does (a host that did not
    run an idle virtual CPU). A call that blocks shows its frame; a long
    computation in C (a huge reply decoded) shows CPU time; a stopped process
    delays the watcher too.
    """

    def __init__(self, lag: LoopLag, driver: FrameType | None, threshold_s: float) -> None:
        super().__init__(name="loop-stall-watcher", daemon=True)
        self._lag = lag
        self._loop_thread = threading.get_ident()
        self._driver = driver
        self._cpu_path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        self._threshold_s = threshold_s
        self._stopped = threading.Event()
        # The generation being collected, or None: a stall inside a collection
        # shows whatever line allocated last, so the report names the collector.
        self._collecting: int | None = None

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        self._collecting = info["generation"] if phase == "start" else None

    def start(self) -> None:
        gc.callbacks.append(self._on_collection)
        super().start()

    def stop(self) -> None:
        self._stopped.set()
        gc.callbacks.remove(self._on_collection)

    def run(self) -> None:
        reported = 0.0
        fd = _open(self._cpu_path)
        try:
            on_cpu, looked = _cpu_s(fd), time.monotonic()
            period = self._threshold_s / 2
            while not self._stopped.wait(period):
                now, was_on_cpu = time.monotonic(), on_cpu
                on_cpu = _cpu_s(fd)
                # Share of the time since the last look the loop thread ran, and
                # whether this thread looked on time (a stopped or descheduled
                # process delays both threads: that stall is not excused).
                busy = (
                    None
                    if on_cpu is None or was_on_cpu is None
                    else (on_cpu - was_on_cpu) / max(now - looked, 1e-6)
                )
                on_time = now - looked <= 1.5 * period
                looked = now
                beat = self._lag.beat
                stalled = now - beat
                if stalled < self._threshold_s or beat == reported:
                    continue
                reported = beat
                frame = sys._current_frames().get(self._loop_thread)
                stack = traceback.format_stack(frame)[-STACK_FRAMES:] if frame else []
                log.warning(
                    "event_loop_stalled",
                    seconds=round(stalled, 3),
                    collecting=self._collecting,
                    polling=(
                        on_time
                        and frame is self._driver
                        and busy is not None
                        and busy < POLLING_BUSY
                    ),
                    stack="".join(stack),
                )
        finally:
            if fd is not None:
                os.close(fd)


def _cpu_s(fd: int | None) -> float | None:
    """A thread's time on a CPU so far (its schedstat), or None where unknown."""
    return None if fd is None else int(os.pread(fd, 128, 0).split()[0]) / 1e9
