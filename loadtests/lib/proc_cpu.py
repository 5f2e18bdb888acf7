"""CPU time of a whole server, each of its processes by name: a PostgreSQL cluster
(the postmaster, its backends and background processes), a Redis, a gateway.

Each live process's threads are read from ``/proc/<pid>/task/*/schedstat``
(nanoseconds, so a short window resolves where clock ticks would not); a
child that exited and was reaped (an autovacuum worker, a backend whose client
left) is in its parent's ``cutime + cstime`` from then on. A snapshot holds
both, so the difference of two snapshots is what the tree spent between them,
whichever of its processes came and went: a child alive at the first snapshot
and reaped before the second is counted as its whole life (``cutime``) less
what the first snapshot already saw of it.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from testkit.processes import descendants_of

_TICK = os.sysconf("SC_CLK_TCK")
REAPED = "reaped children"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """CPU seconds of each process of a tree at one moment, and of its reaped children."""

    by_pid: dict[int, float]
    names: dict[int, str]
    reaped_s: float
    ok: bool = True

    def total(self) -> float:
        """Every live process's seconds plus the reaped children's."""
        return sum(self.by_pid.values()) + self.reaped_s


def local_pid(pid: int) -> int | None:
    """``pid`` when it is a process of this machine (its /proc readable): a
    server's, as it tells its own (``INFO server``'s process_id)."""
    return pid if Path(f"/proc/{pid}/stat").exists() else None


def snapshot(root: int) -> Snapshot:
    """The CPU seconds of ``root``, each descendant, and ``root``'s reaped children."""
    pids = [root, *descendants_of(root)]
    by_pid: dict[int, float] = {}
    names: dict[int, str] = {}
    for pid in pids:
        ran = _ran_s(pid)
        if ran is not None:
            by_pid[pid] = ran
            names[pid] = _title(pid)
    return Snapshot(by_pid, names, _reaped_s(root), ok=root in by_pid)


def spent(
    before: Snapshot, after: Snapshot, label: Callable[[int, str], str] | None = None
) -> dict[str, float]:
    """Seconds spent between two snapshots, summed by ``label(pid, title)`` (the
    process title by default); the reaped children's under :data:`REAPED`.

    A process seen only in ``after`` started in the window: all of it counts. One
    seen only in ``before`` was reaped: its share is in the reaped children's.
    """
    name = label or (lambda _pid, title: title)
    out: dict[str, float] = defaultdict(float)
    for pid, seconds in after.by_pid.items():
        out[name(pid, after.names[pid])] += seconds - before.by_pid.get(pid, 0.0)
    # A reaped child's whole life is in cutime; what `before` saw of it was
    # counted there already.
    gone = sum(s for pid, s in before.by_pid.items() if pid not in after.by_pid)
    out[REAPED] += after.reaped_s - before.reaped_s - gone
    return {k: v for k, v in out.items() if abs(v) > 0.0}


def per_unit_us(seconds: Mapping[str, float], units: int) -> dict[str, float]:
    """Microseconds per unit (an order, a request) of each entry."""
    return {k: round(v / units * 1e6, 2) for k, v in seconds.items()} if units else {}


def _ran_s(pid: int) -> float | None:
    ran = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                ran += int((task / "schedstat").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return ran / 1e9


def _reaped_s(pid: int) -> float:
    with contextlib.suppress(OSError, IndexError, ValueError):
        # The command name may hold spaces and parentheses: fields follow the last ")".
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / _TICK
    return 0.0


def _title(pid: int) -> str:
    """The process title (PostgreSQL rewrites its argv: ``postgres: walwriter``)."""
    with contextlib.suppress(OSError):
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        return raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return "?"
