"""The event loop's lag timer and the stall watcher (gateway.ops.loop_lag)."""

from __future__ import annotations

import asyncio
import threading
import time

from structlog.testing import capture_logs

from gateway.ops.loop_lag import LoopLag
from testkit.polling import wait_for


def _block_the_loop_for(seconds: float) -> None:
    time.sleep(seconds)


async def test_a_blocked_loop_is_recorded_as_lag_and_its_stack_is_logged() -> None:
    """A callback that holds the loop for 0.4 s shows as one lag of about 0.4 s, all
    of it the process's own, and the watcher logs, while the loop is still stuck, a
    stack naming the call."""
    lags: list[float] = []
    own: list[float] = []

    def observe(seconds: float, own_part: float) -> None:
        lags.append(seconds)
        own.append(own_part)

    lag = LoopLag(observe, interval_s=0.02, stall_report_s=0.15)
    with capture_logs() as logs:
        task = asyncio.create_task(lag.run())
        await wait_for(lambda: len(lags) >= 3, within=5, what="the timer runs")
        _block_the_loop_for(0.4)
        await wait_for(lambda: max(lags) > 0.3, within=5, what="the stall is measured")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert 0.3 < max(lags) < 2.0, lags
    # Asleep in a call is the process's own doing, not a wait for a CPU.
    assert max(own) > 0.3, own
    assert all(o <= la for o, la in zip(own, lags, strict=True))
    assert sorted(lags)[len(lags) // 2] < 0.1, "an idle loop's typical lag is small"
    stalls = [e for e in logs if e["event"] == "event_loop_stalled"]
    assert len(stalls) == 1, logs
    assert "_block_the_loop_for" in stalls[0]["stack"]
    assert stalls[0]["seconds"] >= 0.15


async def test_without_a_stall_report_no_watcher_thread_runs() -> None:
    """stall_report_s=0 measures lag only: no thread, no stall log."""
    lags: list[float] = []
    lag = LoopLag(lambda seconds, _own: lags.append(seconds), interval_s=0.01)
    task = asyncio.create_task(lag.run())
    await wait_for(lambda: len(lags) >= 2, within=5, what="the timer runs")
    assert not any(t.name == "loop-stall-watcher" for t in threading.enumerate())
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
