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
# The process's threads, each with its scheduler statistics (``<tid>/schedstat``;
# a pread of one costs a few µs).
TASKS = "/proc/self/task"
# Each CPU's time in clock ticks, steal among it (a pread of it costs ~20 µs).
PROC_STAT = "/proc/stat"
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# A loop thread running or queued for a CPU less than this share of a stall was
# asleep, neither working nor kept from working.
POLLING_BUSY = 0.1
# Innermost frames of a stalled loop's stack put in the log line.
STACK_FRAMES = 12


class LoopLag:
    """Records the loop's lag every ``interval_s``; reports stalls past ``stall_report_s``
    (0: no report, no thread).

    Each lag is told to ``observe`` with its own part: the lag less the time the
    process could not run over the interval (:class:`Unscheduled`: a thread
    runnable but waiting for a CPU, or a virtual CPU held by the hypervisor). On a
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
                # The unscheduled time counts from the previous tick's read: only
                # the observe call lies between that read and this due time.
                due = loop.time() + self._interval_s
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
    """Time the process could not run through no fault of its own: its threads'
    wait on the guest's run queue (``schedstat``) and, in a virtual machine,
    the time the hypervisor held a virtual CPU (``steal`` in ``/proc/stat``;
    of the CPU that lost most, since the loop may have run on either).

    Every thread's wait counts, not only the loop's: a thread handed the
    interpreter's lock (the stall watcher, an executor's thread) holds the
    loop until it gets a CPU, and that wait is the machine's, not the
    process's. A CI run on a loaded machine found the loop stalled 0.2 s in
    plain Python (redis-py packing a command) though its own thread had not
    waited for a CPU: a hand-over of that lock waiting on another thread.

    Each unknown part counts 0; a thread counts from the first read that
    finds it. Steal is counted in clock ticks (10 ms); a wait on a run queue
    during steal may be counted twice, which only ever excuses a lag, never
    blames one.
    """

    def __init__(self, tasks: str = TASKS, stat: str = PROC_STAT) -> None:
        self._tasks = tasks
        # Each thread's schedstat, open while the thread lives (tid: fd).
        self._schedstats: dict[str, int] = {}
        self._stat = _open(stat)
        self._waited = self._read_waited()
        self._stolen = self._read_stolen()

    def since_last(self) -> float:
        """Seconds unscheduled since the previous call (or since created)."""
        waited, stolen = self._read_waited(), self._read_stolen()
        queued = sum(
            max(0.0, now - self._waited[tid]) for tid, now in waited.items() if tid in self._waited
        )
        most = max(
            (now - before for now, before in zip(stolen, self._stolen, strict=False)), default=0
        )
        self._waited, self._stolen = waited, stolen
        return queued + max(0, most) / TICKS_PER_S

    def _read_waited(self) -> dict[str, float]:
        """Each live thread's seconds on a run queue so far."""
        try:
            tids = set(os.listdir(self._tasks))
        except OSError:
            return {}
        for gone in self._schedstats.keys() - tids:
            os.close(self._schedstats.pop(gone))
        waited = {}
        for tid in tids:
            fd = self._schedstats.get(tid)
            if fd is None:
                fd = _open(f"{self._tasks}/{tid}/schedstat")
                if fd is None:
                    continue
                self._schedstats[tid] = fd
            try:
                times = _schedstat(fd)
            except (OSError, ValueError):  # the thread ended since the listing
                continue
            if times is not None:
                waited[tid] = times[1]
        return waited

    def _read_stolen(self) -> list[int]:
        if self._stat is None:
            return []
        # "cpuN user nice system idle iowait irq softirq steal ...", per CPU.
        return [
            int(line.split()[8])
            for line in os.pread(self._stat, 16_384, 0).splitlines()
            if line.startswith(b"cpu") and not line.startswith(b"cpu ")
        ]

    def close(self) -> None:
        for fd in self._schedstats.values():
            os.close(fd)
        self._schedstats.clear()
        if self._stat is not None:
            os.close(self._stat)
            self._stat = None


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
    code (no frame of ours above ``driver``), neither on a CPU nor queued for
    one nearly all the time since the watcher's last look, taken on time:
    asleep in its poll past its timer while this thread ran, which only the
    machine does (a host that did not run an idle virtual CPU). A call that
    blocks shows its frame; a long computation in C (a huge reply decoded)
    shows CPU time, or a wait for a CPU on a loaded machine; a stopped process
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
            times, looked = _schedstat(fd), time.monotonic()
            period = self._threshold_s / 2
            while not self._stopped.wait(period):
                now, before = time.monotonic(), times
                times = _schedstat(fd)
                # Shares of the time since the last look the loop thread ran and
                # ran or waited for a CPU (a computation on a loaded machine is
                # queued, not asleep), and whether this thread looked on time (a
                # stopped or descheduled process delays both: not excused).
                elapsed = max(now - looked, 1e-6)
                busy, wanted = (
                    (None, None)
                    if times is None or before is None
                    else (
                        (times[0] - before[0]) / elapsed,
                        (sum(times) - sum(before)) / elapsed,
                    )
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
                    on_cpu=None if busy is None else round(busy, 2),
                    collecting=self._collecting,
                    polling=(
                        on_time
                        and frame is self._driver
                        and wanted is not None
                        and wanted < POLLING_BUSY
                    ),
                    stack="".join(stack),
                )
        finally:
            if fd is not None:
                os.close(fd)


def _schedstat(fd: int | None) -> tuple[float, float] | None:
    """A thread's seconds on a CPU and queued for one so far (its schedstat), or
    None where unknown."""
    if fd is None:
        return None
    # "<ns on a CPU> <ns waiting on a run queue> <timeslices>"
    on_cpu, queued = os.pread(fd, 128, 0).split()[:2]
    return int(on_cpu) / 1e9, int(queued) / 1e9
