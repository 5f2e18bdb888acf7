"""Each retry loop keeps its delays: one policy object each (redis-py's backoff)."""

from __future__ import annotations

from gateway.lock.backoff import pause
from gateway.resources import STARTUP_BACKOFF
from gateway.usecases.tracking import POLL_BACKOFF
from gateway.write.writer import RETRY_BACKOFF


def test_the_doubling_pauses_start_and_stop_where_they_did() -> None:
    """Start-up waits 0.1 s doubling to 2 s, an order's poll 20 ms to 0.5 s, a
    failed writer batch 50 ms to 2 s."""
    assert [STARTUP_BACKOFF.compute(n) for n in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert [POLL_BACKOFF.compute(n) for n in range(6)] == [0.02, 0.04, 0.08, 0.16, 0.32, 0.5]
    assert [RETRY_BACKOFF.compute(n) for n in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]


def test_a_long_outage_keeps_pausing_at_the_cap() -> None:
    """``pause`` stops the count of failures at DOUBLINGS (redis-py's 2**failures
    overflows a float past about 1,000), where the pause is already the cap."""
    assert pause(STARTUP_BACKOFF, 100_000) == 2.0
    assert pause(RETRY_BACKOFF, 100_000) == 2.0
    assert [pause(RETRY_BACKOFF, n) for n in range(3)] == [0.05, 0.1, 0.2]
