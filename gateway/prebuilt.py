"""The sold-out answer as bytes made once: the head and body of a ``409``, written
to the socket in one call.

A flash sale's storm is mostly answered sold out, and the answer never changes
but for its ``Date``. Building it as a ``web.Response`` costs more than deciding
it: a header multidict, the content type parsed back, then at send time the
keep-alive and length headers worked out and every header serialised again. A
:class:`Prebuilt` holds the whole message but the date (cached per second) and
writes it with one ``transport.write``; aiohttp's ``prepare`` and
``write_eof`` calls on it do nothing else. One instance serves every request, so
it holds no request's state.

It is used only where the plain response would carry exactly the same headers:
an HTTP/1.1 request that keeps its connection alive (no ``Connection`` header
to add), while the connection's write buffer is small (a client that pipelines
without reading gets aiohttp's own writer, which waits for the buffer to
drain). Anything else gets the ordinary response.
"""

from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus

from aiohttp import HttpVersion11, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import SERVER_SOFTWARE

from gateway.appkeys import OUTCOME

# Beyond this many bytes waiting to be sent, a connection's next answer goes
# through aiohttp's writer, which applies backpressure.
BUFFERED_MAX = 64 * 1024


class Prebuilt(web.StreamResponse):
    """A constant JSON answer; see the module docstring for when it may be sent."""

    def __init__(self, status: int, body: bytes, outcome: str) -> None:
        super().__init__(status=status)
        self[OUTCOME] = outcome
        # The headers, and their order, of the web.Response it stands for.
        self._head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Date: "
        ).encode()
        self._tail = f"\r\nServer: {SERVER_SOFTWARE}\r\n\r\n".encode() + body
        self._second = -1
        self._message = b""

    def fits(self, request: web.BaseRequest) -> bool:
        """Whether ``request`` may be answered with these bytes."""
        transport = request.transport
        return (
            request.version == HttpVersion11
            and request.keep_alive
            and transport is not None
            and transport.get_write_buffer_size() < BUFFERED_MAX
        )

    @property
    def keep_alive(self) -> bool:
        """Sent only where the connection stays open (see :meth:`fits`)."""
        return True

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        """Write the whole answer now."""
        transport = request.transport
        if transport is not None:
            transport.write(self._now())
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        """Nothing left to write: :meth:`prepare` sent the body."""

    def _now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            date = formatdate(second, usegmt=True).encode()
            self._message = self._head + date + self._tail
            self._second = second
        return self._message
