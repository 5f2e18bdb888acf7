"""``python -m loadtests.bench_handoff`` runs end to end on the test Redis: every
pass appended, a cell per size and round, the line over the sizes, its stream
key removed. Nothing here measures speed."""

from __future__ import annotations

from pathlib import Path

import orjson
import redis

from loadtests.tests.integration.runs import run_bench
from testkit.services import REDIS_URL

# A subprocess: the bench pins itself and runs on uvloop.
RUN_TIMEOUT_S = 60


def test_two_sizes_each_round_give_a_line_and_leave_no_key(tmp_path: Path) -> None:
    """Passes of 2 and 5 events, two rounds: exit 0, four cells, a median and a
    line per side (Redis's CPU read when it is this machine's), the table
    printed, no stream left behind."""
    out = tmp_path / "handoff.json"
    done = run_bench(
        "bench_handoff",
        "--sizes=2,5",
        "--passes=20",
        "--rounds=2",
        "--no-pin",
        f"--out={out}",
        timeout_s=RUN_TIMEOUT_S,
        postgres=False,
    )
    results = orjson.loads(out.read_bytes())
    assert sorted((c["round"], c["size"]) for c in results["cells"]) == [
        (0, 2),
        (0, 5),
        (1, 2),
        (1, 5),
    ]
    assert [row["size"] for row in results["summary"]["sizes"]] == [2, 5]
    assert set(results["summary"]["line"]["gateway_us"]) == {"pass_us", "event_us"}
    assert "| events a pass | gateway µs an event | Redis µs an event |" in done.stdout
    client = redis.Redis.from_url(REDIS_URL)
    try:
        assert not list(client.scan_iter(match="fsbench-handoff-*"))
    finally:
        client.close()
