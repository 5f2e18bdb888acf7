"""CPU time a target spent, read from /proc: a measure that contention barely moves.

Requests per second swing by tens of percent on a shared machine, since other
work takes the target's core; the CPU time the target itself spent per request
moves much less, so it is the steadier figure for comparing code on a busy
machine (cache and frequency effects remain).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from testkit.processes import descendants_of

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of ``pid`` and its live descendants (workers)."""
    return sum(_own(p) for p in (pid, *descendants_of(pid)))


def _own(pid: int) -> float:
    with contextlib.suppress(OSError):
        # The command name may hold spaces and parentheses: fields follow the last ")".
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    return 0.0


def run_and_queued(pid: int) -> tuple[float, float] | None:
    """Seconds the threads of ``pid`` ran on a core and waited in a run queue for one
    (``/proc/<pid>/task/*/schedstat``, in nanoseconds, so short runs resolve where
    :func:`cpu_seconds`' clock ticks do not), or None when ``pid`` is gone or not ours
    to read."""
    ran = queued = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            fields = (task / "schedstat").read_text().split()
            ran, queued = ran + int(fields[0]), queued + int(fields[1])
    except (OSError, IndexError, ValueError):
        return None
    return ran / 1e9, queued / 1e9
