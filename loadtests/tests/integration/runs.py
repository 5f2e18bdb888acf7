"""A bench run as its command line runs it, against the test servers."""

from __future__ import annotations

import subprocess
import sys

from loadtests.lib.options import REPO_ROOT
from testkit.services import PG_ADMIN_URL, REDIS_URL


def run_bench(
    module: str, *args: str, timeout_s: float, postgres: bool = True
) -> subprocess.CompletedProcess[str]:
    """``python -m loadtests.<module> ARGS`` from the repository's root, on the
    test Redis and (unless not ``postgres``) PostgreSQL, within ``timeout_s``;
    asserts it exited 0."""
    servers = [f"--pg-url={PG_ADMIN_URL}"] if postgres else []
    done = subprocess.run(
        [sys.executable, "-m", f"loadtests.{module}", *args, *servers, f"--redis-url={REDIS_URL}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done
