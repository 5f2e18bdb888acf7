"""The close after a drain is bounded: a task that ignores its cancel is reported
with its stack instead of holding the process's exit forever."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web
from structlog.testing import capture_logs

from gateway.server import _close_within


async def _runner(cleanup: web.Application) -> web.AppRunner:
    runner = web.AppRunner(cleanup, handle_signals=False)
    await runner.setup()
    return runner


async def test_a_close_that_overruns_is_reported_with_the_stuck_stack() -> None:
    released = asyncio.Event()

    async def stubborn(app: web.Application) -> AsyncIterator[None]:
        yield
        while not released.is_set():  # swallows every cancel, as a buggy client may
            try:
                await released.wait()
            except asyncio.CancelledError:
                continue

    app = web.Application()
    app.cleanup_ctx.append(stubborn)
    runner = await _runner(app)
    try:
        with capture_logs() as logs:
            assert await _close_within(runner, 0.3) is False
    finally:
        released.set()  # let the left-behind close end, so the test's loop closes
    overran = [entry for entry in logs if entry["event"] == "close_overran"]
    assert len(overran) == 1, logs
    chains = overran[0]["tasks"].values()
    # The chain runs from aiohttp's cleanup into the cleanup context that hangs.
    [chain] = [c for c in chains if "BaseRunner.cleanup" in c[0]]
    assert any("stubborn" in frame for frame in chain), chain


async def test_a_close_within_its_bound_is_clean() -> None:
    closed = asyncio.Event()

    async def tidy(app: web.Application) -> AsyncIterator[None]:
        yield
        closed.set()

    app = web.Application()
    app.cleanup_ctx.append(tidy)
    runner = await _runner(app)
    with capture_logs() as logs:
        assert await _close_within(runner, 5.0) is True
    assert closed.is_set()
    assert not [entry for entry in logs if entry["event"] == "close_overran"]
