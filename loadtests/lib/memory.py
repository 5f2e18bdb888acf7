"""How much memory a target uses, read from /proc."""

from __future__ import annotations

import contextlib
from pathlib import Path

from testkit.processes import descendants_of


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process in KiB, from /proc.

    With child processes (``GATEWAY_WORKERS`` > 1: a supervisor and its
    workers) also ``tree_VmRSS``, the sum over the process and its descendants.
    """
    found = _status_kib(pid)
    descendants = descendants_of(pid)
    if descendants:
        found["tree_VmRSS"] = found.get("VmRSS", 0) + sum(
            _status_kib(child).get("VmRSS", 0) for child in descendants
        )
    return found


def _status_kib(pid: int) -> dict[str, int]:
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0])
    return found
