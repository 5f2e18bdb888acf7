"""An in-process gateway served as production serves it, and raw HTTP to it.

:func:`served` runs the app behind gateway.server's own site (the
connection guard's parser limits and JSON refusals) with the fast path, on a
free port of this process, so a test sends bytes no HTTP client would (a
header byte that is not UTF-8, a body that is not what its Content-Encoding
says) and reads the gateway's log lines with ``structlog.testing``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.app import create_app
from gateway.http import fastpath
from gateway.http.limits import LimitedSite
from gateway.settings import Settings

# The payment service's token of a served gateway, and a waiting room for its skus.
PAYMENT_TOKEN = "edge-payment-token-0123456789"
ROOM = {"admit_per_s": 100, "token_ttl_s": 60}


@contextlib.asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[web.Application]:
    """The gateway app on ``settings.port`` behind :class:`LimitedSite`, with the fast path."""
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        assert runner.server is not None
        fastpath.install(app, runner.server)
        await LimitedSite(runner, settings).start()
        yield app
    finally:
        await runner.cleanup()


@dataclass(frozen=True, slots=True)
class Answer:
    """One response as it came off the socket."""

    status: int
    head: str
    body: bytes
    # Every status line read, interim ones (100 Continue) included.
    statuses: tuple[int, ...]

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)

    @property
    def is_json(self) -> bool:
        """Whether the final answer says it is JSON."""
        return "content-type: application/json" in self.head.lower()


async def exchange(port: int, request: bytes, within: float = 10.0) -> Answer:
    """Send ``request`` (whole, with ``Connection: close``) and read until the
    gateway closes; the last response's status, head and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), within)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    statuses = []
    while raw.startswith(b"HTTP/1.1 1"):
        interim, _, raw = raw.partition(b"\r\n\r\n")
        statuses.append(int(interim.split()[1]))
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split()[1]) if head else 0
    return Answer(status, head.decode("latin-1"), body, (*statuses, status))


def request(
    method: str,
    target: str | bytes,
    headers: Mapping[str, str | bytes] | None = None,
    body: bytes = b"",
    *,
    length: int | None = None,
) -> bytes:
    """An HTTP/1.1 request's bytes, closing the connection after it; header
    values given as bytes are sent as they are. ``length`` declares another
    Content-Length than the body's."""
    line = target if isinstance(target, bytes) else target.encode()
    lines = [method.encode() + b" " + line + b" HTTP/1.1", b"Host: gateway", b"Connection: close"]
    for name, value in (headers or {}).items():
        lines.append(
            name.encode() + b": " + (value if isinstance(value, bytes) else value.encode())
        )
    if body or length is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(b"Content-Length: " + str(len(body) if length is None else length).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
