"""``python -m loadtests.bench_reconcile`` runs end to end on the real servers:
its passes visit the active skus alone (the bench checks every pass) and it
prints its table. Nothing here measures speed."""

from __future__ import annotations

from loadtests.tests.integration.runs import run_bench

RUN_TIMEOUT_S = 120


def test_one_small_round_visits_the_active_skus_alone() -> None:
    """One round over 2 active and 20 idle skus: exit 0 and the three rows."""
    done = run_bench(
        "bench_reconcile",
        "--rounds=1",
        "--active=2",
        "--idle=20",
        timeout_s=RUN_TIMEOUT_S,
    )
    assert "| 2 active + 20 idle | 22 | 2 |" in done.stdout
    assert "| full pass (as every pass before) | 22 | 22 |" in done.stdout
