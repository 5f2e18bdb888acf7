"""Running the application: listen, wait for a signal, drain within a bound.

On SIGTERM or SIGINT the gateway first turns away new purchases with 503 and
``/readyz`` with 503 while it keeps listening, so a load balancer sees it
leave; it then finishes and settles every queued batch, stops listening, waits
for the last handlers, and closes its resources. All of that is bounded by
``GATEWAY_DRAIN_S``; the process then exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable

import structlog
import uvloop
from aiohttp import web

from gateway.app import create_app
from gateway.keys import SERVICE
from gateway.settings import Settings

log = structlog.get_logger(__name__)

StartupHook = Callable[[web.Application], Awaitable[None]]


async def run(settings: Settings, on_startup: StartupHook | None = None) -> None:
    """Serve ``settings`` until a stop signal, then drain and return."""
    app = create_app(settings)
    if on_startup is not None:
        app.on_startup.append(on_startup)
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, shutdown_timeout=settings.drain_s
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port, reuse_port=True)
        await site.start()
        log.info("serving", host=settings.host, port=settings.port)
        await _stop_signal()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.drain_s
        service = app[SERVICE]
        service.draining = True
        log.info("draining", queued=service.batcher.depth)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await service.close()
    finally:
        await runner.cleanup()
    log.info("stopped")


async def _stop_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def serve(settings: Settings, on_startup: StartupHook | None = None) -> None:
    """Run the gateway on uvloop until SIGTERM or SIGINT."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run(settings, on_startup))
