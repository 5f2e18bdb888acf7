"""The suite's lag check: a gateway process whose event loop stalled fails its test.

Every gateway process the suite starts (testkit.gateways) is read at
readiness and at its close: a timer run more than 1 s late in between fails
the test. Here a gateway's loop is held still for 2 s (SIGSTOP, then
SIGCONT, sent directly so the guard is not told it was on purpose).
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from testkit.gateways import GatewayCluster
from testkit.metrics import scrape
from testkit.services import REDIS_URL

REQUIRED_BUCKETS = ("0.001", "0.005", "0.01", "0.05", "0.1", "0.25", "1.0", "5.0")


async def test_a_gateway_whose_loop_stalled_fails_its_test(
    database_url: str, key_prefix: str
) -> None:
    """flashsale_event_loop_lag_seconds is exported with the operator's buckets, and
    closing a gateway whose loop ran a timer 2 s late raises the guard's error."""
    gateways = GatewayCluster(
        1, redis_url=REDIS_URL, database_url=database_url, key_prefix=key_prefix
    )
    await gateways.start()
    try:
        found = await scrape(gateways[0].url)
        for le in REQUIRED_BUCKETS:
            assert f'flashsale_event_loop_lag_seconds_bucket{{le="{le}"}}' in found, le
        assert await gateways[0].lag_report() is None, "an idle gateway does not stall"
        gateways[0].kill(signal.SIGSTOP)
        await asyncio.sleep(2.0)  # the stall itself: the fault this test makes
        gateways[0].kill(signal.SIGCONT)
    except BaseException:
        await gateways.close()
        raise
    with pytest.raises(AssertionError, match="event loop stalled: gateway 0"):
        await gateways.close()
