"""``python -m loadtests.bench_reconcile`` runs end to end on the real servers:
its passes visit the active skus alone (the bench checks every pass) and it
prints its table. Nothing here measures speed."""

from __future__ import annotations

import subprocess
import sys

from loadtests.lib.options import REPO_ROOT
from testkit.services import PG_ADMIN_URL, REDIS_URL

RUN_TIMEOUT_S = 120


def test_one_small_round_visits_the_active_skus_alone() -> None:
    """One round over 2 active and 20 idle skus: exit 0 and the three rows."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtests.bench_reconcile",
            "--rounds=1",
            "--active=2",
            "--idle=20",
            f"--pg-url={PG_ADMIN_URL}",
            f"--redis-url={REDIS_URL}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 2 active + 20 idle | 22 | 2 |" in done.stdout
    assert "| full pass (as every pass before) | 22 | 22 |" in done.stdout
