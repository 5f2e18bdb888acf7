"""``python -m loadtests.bench_reserve`` speaks reserve.lua's current contract: both
shapes reserve every purchase they send (the bench asserts each reply is "ok")
and it leaves no key behind. Nothing here measures speed; it once fell behind
the script's arguments without anyone noticing."""

from __future__ import annotations

import subprocess
import sys

from redis import Redis

from loadtests.lib.options import REPO_ROOT
from testkit.services import REDIS_URL

RUN_TIMEOUT_S = 60


def test_one_short_round_reserves_in_both_shapes_and_cleans_up() -> None:
    """One round of 50 ms per shape and batch size: exit 0, every batch size in the
    table, no benchreserve key left in Redis."""
    done = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_reserve"],
        cwd=REPO_ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "BENCH_REDIS_URL": REDIS_URL,
            "BENCH_ROUNDS": "1",
            "BENCH_DURATION": "0.05",
        },
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split()[0] for line in done.stdout.splitlines()[2:]]
    assert rows == ["1", "16", "64", "256"], done.stdout
    with Redis.from_url(REDIS_URL) as redis:
        assert list(redis.scan_iter(match="benchreserve*", count=1000)) == []
