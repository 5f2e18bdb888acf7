"""The pause a retry loop takes after its failures, from a redis-py backoff."""

from __future__ import annotations

from redis.backoff import AbstractBackoff

# redis-py's backoff doubles as 2**failures, which overflows a float past about
# 1,000 failures: the count stops here, long after any pause reached its cap.
DOUBLINGS = 30


def pause(backoff: AbstractBackoff, failures: int) -> float:
    """Seconds to wait after ``failures`` failures in a row.

    Args:
        backoff: the loop's policy (an ``ExponentialBackoff``, a jittered one...).
        failures: how many failed so far; any count, however long the outage.

    Returns:
        ``backoff.compute`` of the count, stopped at :data:`DOUBLINGS`.
    """
    return backoff.compute(min(failures, DOUBLINGS))
