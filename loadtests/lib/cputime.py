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
