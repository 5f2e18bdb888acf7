"""``python -m loadtests.bench_relay`` runs end to end on the real servers: a drain
per (relays, batch), each checked by the bench itself (the outbox owes nothing,
the stream holds every event once), and its results file written. Nothing here
measures speed."""

from __future__ import annotations

from pathlib import Path

import orjson

from loadtests.tests.integration.runs import run_bench

# A subprocess: the bench pins itself and runs on uvloop.
RUN_TIMEOUT_S = 60


def test_one_small_round_drains_to_the_stream_and_a_webhook(tmp_path: Path) -> None:
    """One round of 200 events in batches of 32 to the stream and to a loopback
    webhook receiver, by one relay and by two: exit 0, a drain and a summary
    row each, and the table printed."""
    out = tmp_path / "relay.json"
    done = run_bench(
        "bench_relay",
        "--events=200",
        "--rounds=1",
        "--batches=32",
        "--relays=1,2",
        "--sinks=stream,webhook",
        "--no-pin",
        f"--out={out}",
        timeout_s=RUN_TIMEOUT_S,
    )
    results = orjson.loads(out.read_bytes())
    cells = [("stream", 1), ("stream", 2), ("webhook", 1), ("webhook", 2)]
    assert [(d["sink"], d["relays"]) for d in results["drains"]] == cells
    assert [(r["sink"], r["relays"]) for r in results["summary"]] == cells
    assert "| sink | relays | batch | events/s median (min-max) |" in done.stdout
