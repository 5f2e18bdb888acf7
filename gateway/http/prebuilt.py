"""Purchase answers written straight to the socket: head and body in one call.

A flash sale's storm is answered with a few short JSON bodies: sold out, and
for the buyers who get a unit, their order. Building each as a ``web.Response``
costs more than deciding it: a header multidict, the content type parsed back,
then at send time the keep-alive and length headers worked out and every header
serialised again. :class:`DirectAnswers` writes the whole message with one
``transport.write`` (the head cached per status and length, the date per
second, a constant body such as sold out's whole message per second), and
hands aiohttp a :class:`Written` response whose ``prepare`` and ``write_eof``
do nothing. A ``Written`` holds no request's state, so one per outcome serves
every request.

It is used only where the plain response would carry exactly the same bytes:
an HTTP/1.1 request that keeps its connection alive (no ``Connection`` header
to add), while the connection's write buffer is small (a client that pipelines
without reading gets aiohttp's own writer, which waits for the buffer to
drain), and for answers with no header of their own (not ``Retry-After``).
Anything else gets the ordinary response.
"""

from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus

from aiohttp import HttpVersion11, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import SERVER_SOFTWARE

from gateway.http.middlewares import OUTCOME

# Beyond this many bytes waiting to be sent, a connection's next answer goes
# through aiohttp's writer, which applies backpressure.
BUFFERED_MAX = 64 * 1024
_SERVER = f"\r\nServer: {SERVER_SOFTWARE}\r\n\r\n".encode()


class Written(web.StreamResponse):
    """An answer already written to the socket, tagged with its outcome."""

    def __init__(self, status: int, outcome: str) -> None:
        super().__init__(status=status)
        self[OUTCOME] = outcome

    @property
    def keep_alive(self) -> bool:
        """Sent only where the connection stays open (see :meth:`DirectAnswers.fits`)."""
        return True

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        """Nothing to send: the answer went out whole."""
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        """Nothing to send: the answer went out whole."""


class DirectAnswers:
    """Writes JSON answers as aiohttp's ``web.Response`` would, in one call."""

    def __init__(self) -> None:
        self._second = -1
        # (status, body length) -> the head up to the date; the date; constant
        # bodies -> their whole message. Dates change each second, and so
        # everything built with one.
        self._heads: dict[tuple[int, int], bytes] = {}
        self._date = b""
        self._whole: dict[bytes, bytes] = {}

    @staticmethod
    def fits(request: web.BaseRequest) -> bool:
        """Whether ``request`` may be answered directly."""
        transport = request.transport
        return (
            request.version == HttpVersion11
            and request.keep_alive
            and transport is not None
            and transport.get_write_buffer_size() < BUFFERED_MAX
        )

    def send(self, request: web.BaseRequest, status: int, body: bytes, answer: Written) -> Written:
        """Write ``body`` with its head to ``request``'s connection; ``answer``
        (its status and outcome) is what the handler returns to aiohttp."""
        self._turn_the_second()
        transport = request.transport
        if transport is not None:
            transport.write(self._head(status, len(body)) + body)
        return answer

    def send_constant(
        self, request: web.BaseRequest, status: int, body: bytes, answer: Written
    ) -> Written:
        """As :meth:`send`, for a body that never changes: its whole message is
        kept for the second."""
        self._turn_the_second()
        whole = self._whole.get(body)
        if whole is None:
            whole = self._whole[body] = self._head(status, len(body)) + body
        transport = request.transport
        if transport is not None:
            transport.write(whole)
        return answer

    def _turn_the_second(self) -> None:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._date = formatdate(second, usegmt=True).encode()
            self._heads.clear()
            self._whole.clear()

    def _head(self, status: int, length: int) -> bytes:
        head = self._heads.get((status, length))
        if head is None:
            # The headers, and their order, of the web.Response it stands for.
            head = self._heads[(status, length)] = (
                (
                    f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {length}\r\n"
                    "Date: "
                ).encode()
                + self._date
                + _SERVER
            )
        return head
