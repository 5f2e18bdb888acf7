"""``python -m loadtests.bench_flush`` runs end to end on the real servers: a drain
per lock mode, each checked by the bench itself (every purchase confirmed, the
ledger empty, the stock sold), and its results file written. Nothing here
measures speed."""

from __future__ import annotations

from pathlib import Path

import orjson

from loadtests.lib.flush_report import MODES
from loadtests.tests.integration.runs import run_bench

# A subprocess: the bench pins itself and sets the collector's thresholds.
RUN_TIMEOUT_S = 60


def test_one_small_round_drains_every_mode_and_writes_its_results(tmp_path: Path) -> None:
    """One round of one batch of 32 a mode: exit 0, a drain and a row per mode."""
    out = tmp_path / "flush.json"
    done = run_bench(
        "bench_flush",
        "--rounds=1",
        "--batches=32",
        "--orders=32",
        "--no-pin",
        f"--out={out}",
        timeout_s=RUN_TIMEOUT_S,
    )
    results = orjson.loads(out.read_bytes())
    assert sorted(d["mode"] for d in results["drains"]) == sorted(MODES)
    assert all(d["batch"] == 32 and d["batches"] == 1 for d in results["drains"])
    assert [(r["mode"], r["batch"]) for r in results["summary"]] == [(m, 32) for m in MODES]
    assert "| batch | per-batch orders/s |" in done.stdout
