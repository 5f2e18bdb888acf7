"""Keeping the load generator off the servers' core.

On a machine with at least two cores the load generator (wrk) runs on core 0
and the servers it drives (the gateway, the baselines) on core 1, with
``taskset``; otherwise they share what there is. Redis and PostgreSQL are
shared servers started before the run, and are left where the kernel puts them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

LOAD_CORE, SERVER_CORE = 0, 1


@dataclass(frozen=True, slots=True)
class Pinning:
    """Which core the load and the servers get, or None to leave them unpinned."""

    load: int | None
    servers: int | None

    def load_command(self, command: Sequence[str]) -> list[str]:
        """``command`` run on the load generator's core."""
        return _on(self.load, command)

    def server_command(self, command: Sequence[str]) -> list[str]:
        """``command`` run on the servers' core (its children stay there too)."""
        return _on(self.servers, command)

    def join_servers(self) -> None:
        """Move the calling process onto the servers' core: a bench that runs the
        gateway's code in-process is the server side itself."""
        if self.servers is not None:
            os.sched_setaffinity(0, {self.servers})

    def describe(self) -> str:
        """One line for the results."""
        if self.load is None:
            return "unpinned"
        return f"load generator on core {self.load}, servers on core {self.servers}"


def choose(enabled: bool = True) -> Pinning:
    """Pin when asked, ``taskset`` exists and at least two cores are ours."""
    cores = sorted(os.sched_getaffinity(0))
    if not enabled or len(cores) < 2 or shutil.which("taskset") is None:
        return Pinning(None, None)
    return Pinning(cores[LOAD_CORE], cores[SERVER_CORE])


def _on(core: int | None, command: Sequence[str]) -> list[str]:
    if core is None:
        return list(command)
    return ["taskset", "--cpu-list", str(core), *command]
