"""What a benchmark ran on: CPUs, memory, load, versions and the commit."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from loadtests.lib.options import REPO_ROOT


def _first(path: str, key: str) -> str | None:
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key:
                return value.strip()
    return None


def _command(*cmd: str) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = (done.stdout or done.stderr).strip()
    return out.splitlines()[0] if out else None


def describe() -> dict[str, Any]:
    """The machine, the software and the commit, for a results file."""
    status = _command("git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked=no")
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": _first("/proc/cpuinfo", "model name"),
        "mem_total": _first("/proc/meminfo", "MemTotal"),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "wrk": _command("wrk", "--version"),
        "commit": _command("git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"),
        # Others work on this tree while we measure: say so in the results.
        "dirty": bool(status),
    }


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages: how busy the machine was."""
    return os.getloadavg()
