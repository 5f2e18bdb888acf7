"""A loopback webhook receiver: an aiohttp server whose answers a test chooses.

It records what it got, counts the requests it holds at once, and can hold
each until a number of them arrived (``gate``), so a test sees concurrency
without timing it, or hang until the test ends (``hang``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from testkit.ports import HOST, free_port

# Longest a gated request waits for the others before it is answered anyway.
GATE_WITHIN_S = 10.0


@dataclass(frozen=True)
class Received:
    """One request as it arrived."""

    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """Answers ``status`` (a 3xx points at ``/elsewhere``) after ``delay_s``;
    with ``gate``, first holds each request until ``gate`` are in flight."""

    status: int = 204
    delay_s: float = 0.0
    gate: int = 0
    hang: bool = False
    received: list[Received] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    _open: asyncio.Event = field(default_factory=asyncio.Event)
    _released: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.received.append(Received(request.path, dict(request.headers), body))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self._hold()
        finally:
            self.in_flight -= 1
        headers = {"Location": "/elsewhere"} if 300 <= self.status < 400 else None
        return web.Response(status=self.status, headers=headers, text="answer body")

    async def _hold(self) -> None:
        if self.gate and self.in_flight >= self.gate:
            self._open.set()
        if self.gate:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(GATE_WITHIN_S):
                    await self._open.wait()
        if self.hang:
            await self._released.wait()
        await asyncio.sleep(self.delay_s)

    def release(self) -> None:
        """Let hanging requests go (at the end of a test)."""
        self._released.set()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def serving(handler: Handler, app: web.Application | None = None) -> AsyncIterator[str]:
    """Serve ``handler`` for POSTs to any path on a free loopback port; yields
    the URL of ``/hook``."""
    app = app or web.Application()
    app.router.add_post("/{path:.*}", handler)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, HOST, port).start()
    try:
        yield f"http://{HOST}:{port}/hook"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def receiving(receiver: Receiver) -> AsyncIterator[str]:
    """:func:`serving` a :class:`Receiver`; hanging requests are let go at the end."""
    async with serving(receiver.handle) as url:
        try:
            yield url
        finally:
            receiver.release()
