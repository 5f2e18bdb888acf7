"""How long a gateway doubts Redis's sold-out answers after a failure."""

from __future__ import annotations

from gateway.usecases.doubt import MIN_WINDOW_S, RedisDoubt, window_for


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_doubt_before_any_failure() -> None:
    """A gateway that never saw Redis fail trusts it, whatever the clock says."""
    assert not RedisDoubt(5.0, Clock())


def test_a_failure_is_doubted_for_the_window_from_the_last_one() -> None:
    """Doubt starts at a failure, a later failure extends it, and it ends a
    window after the last one."""
    clock = Clock()
    doubt = RedisDoubt(5.0, clock)
    doubt.failed()
    clock.now += 4.0
    assert doubt
    doubt.failed()
    clock.now += 4.0
    assert doubt
    clock.now += 1.0
    assert not doubt


def test_the_window_outlasts_three_reconciler_passes() -> None:
    """At least MIN_WINDOW_S; three intervals of a slow reconciler."""
    assert window_for(0.5) == MIN_WINDOW_S
    assert window_for(60.0) == 180.0
