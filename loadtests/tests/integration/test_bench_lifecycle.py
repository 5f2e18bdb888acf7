"""``python -m loadtests.bench_lifecycle`` still runs end to end: one tiny sale with a
payment window, its returns sold again, a held sku expired by the sweep, and
the audit, all checks reported ok. Nothing here measures speed; the bench is
long, and would otherwise rot between the times someone runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from redis import Redis

from loadtests.lib.options import REPO_ROOT
from testkit.services import REDIS_URL

RUN_TIMEOUT_S = 240


def test_a_tiny_sale_ends_every_unit_paid_with_resales_equal_to_returns(tmp_path: Path) -> None:
    """40 units with 1 s to pay and 20 held: exit 0, every check ok (every unit paid,
    resales = returns = return movements, the audit balanced), the return lag
    observed by the gateway, and none of the run's keys left in Redis."""
    out = tmp_path / "lifecycle.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtests.bench_lifecycle",
            *("--units", "40", "--window", "1", "--hold-units", "20", "--idle", "0.2"),
            *("--buyers", "4", "--timeout", "120", "--out", str(out)),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    assert results["checks"] and all(results["checks"].values()), results["checks"]
    sale = results["sale"]
    assert sale["paid"] == 40
    assert sale["resales"] == sale["returns"]["expired"] + sale["returns"]["cancelled"] > 0
    assert sale["lag_metric"]["n"] == sale["books"]["orders"]["expired"]
    assert results["sweep"]["held"] == 20
    with Redis.from_url(REDIS_URL) as redis:
        assert list(redis.scan_iter(match=f"fsbench{results['run_id']}:*", count=1000)) == []
