"""A skewed clock for a child process: libfaketime, preloaded.

``faketime`` (Debian package, installed by ``scripts/services.sh faketime`` as
root when missing) shifts what ``clock_gettime``/``time`` return inside the
process it is preloaded into, and nowhere else: Redis and PostgreSQL keep the
true time.
"""

from __future__ import annotations

import glob
import subprocess

from testkit.gateways import REPO

LIBRARY_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"


def libfaketime() -> str:
    """The path of libfaketime, installed first when missing; raises if it cannot be."""
    found = glob.glob(LIBRARY_GLOB)
    if not found:
        subprocess.run(
            ["bash", str(REPO / "scripts" / "services.sh"), "faketime"], check=True, timeout=600
        )
        found = glob.glob(LIBRARY_GLOB)
    if not found:
        raise RuntimeError("libfaketime is not installed and could not be installed")
    return found[0]


def skewed_env(offset: str) -> dict[str, str]:
    """Environment variables that run a process ``offset`` (``+1h``) off the true
    wall clock; the monotonic clock is left alone, so timeouts behave."""
    return {
        "LD_PRELOAD": libfaketime(),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
