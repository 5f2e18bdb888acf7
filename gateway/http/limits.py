"""Hostile clients: bounded request heads, a read deadline, a connection cap.

aiohttp bounds the size of a request line, of a header and the number of
headers (its parser's ``max_line_size``, ``max_field_size``, ``max_headers``),
but has no deadline for reading a request: its keep-alive timer only runs
between requests, so a client sending one byte a second (slowloris) holds a
connection, and a task, for as long as it likes. :class:`LimitedHandler` is
aiohttp's request handler with that deadline, at the protocol level, where the
bytes arrive:

- a deadline of ``GATEWAY_REQUEST_READ_TIMEOUT_S`` is armed when a connection
  opens and whenever bytes of a request arrive while none is being read;
- it is disarmed once the request is read whole (head, and body to its end);
- when it fires on a request still incomplete and nothing was answered on it
  yet, the client gets a JSON 408 and the connection closes: written here when
  the head is incomplete, or by the handler when the head is whole and its
  body short (its read fails with :class:`BodyTimeout`, counted as the
  outcome ``client_gone``); otherwise the connection is dropped. A request is
  not timed while an earlier one on the same connection is being handled; it
  is from the first byte that arrives after.

:class:`LimitedSite` listens like ``web.TCPSite`` but builds these handlers,
and refuses connections beyond ``GATEWAY_MAX_CONNECTIONS`` per process at
once, with a 503 and a close, before any byte is read. Errors the parser
answers itself (bad request line, headers too long or too many) are JSON like
every other error.

Both classes lean on aiohttp's internals (the handler's message queue, the
site's fields): aiohttp is pinned, and ``tests/unit/test_library_reaches.py``
fails when what they read changes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol, cast

import orjson
import structlog
from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from gateway.settings import Settings

log = structlog.get_logger(__name__)

# A request line carries a route and at most a 64-character id: 4 KiB is ample.
MAX_LINE_SIZE = 4096
# One header line; an admission token or a bearer token is under 200 bytes.
MAX_FIELD_SIZE = 4096
# Browsers send about 15, a balancer adds a few.
MAX_HEADERS = 48
BACKLOG = 1024

# The detail of a body in an encoding the parser cannot decode (br without
# Brotli, zstd without its module): the encodings every install decodes.
UNDECODED = "Content-Encoding must be gzip, deflate or none"

_CODES = {
    400: "invalid_request",
    408: "request_timeout",
    413: "too_large",
    431: "headers_too_large",
}


def _raw_response(status: int, reason: str, error: str, extra: str = "") -> bytes:
    """A complete HTTP/1.1 response closing the connection, for when no request
    object exists to answer through."""
    body = orjson.dumps({"error": error})
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


OVER_CAPACITY = _raw_response(503, "Service Unavailable", "unavailable", "Retry-After: 1\r\n")
READ_TIMEOUT = _raw_response(408, "Request Timeout", "request_timeout")


class BodyTimeout(TimeoutError):
    """A request's body did not arrive within the read deadline."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no whole body within {seconds:g} s")
        self.seconds = seconds


class LimitsObserver(Protocol):
    """What the metrics want to know of the limits (see gateway.ops.metrics)."""

    def connection_refused(self) -> None: ...
    def read_timed_out(self) -> None: ...


class _Unobserved:
    """Limits nobody counts."""

    def connection_refused(self) -> None:
        """Nothing to count."""

    def read_timed_out(self) -> None:
        """Nothing to count."""


UNOBSERVED = _Unobserved()


@dataclass(slots=True)
class Connections:
    """The open connections of one process, against their cap."""

    limit: int
    open: int = 0


class LimitedHandler(RequestHandler):
    """aiohttp's request handler with a read deadline and a connection cap."""

    def __init__(
        self,
        manager: web.Server,
        *,
        connections: Connections,
        read_timeout_s: float,
        observer: LimitsObserver,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._connections = connections
        self._read_timeout_s = read_timeout_s
        self._observer = observer
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._connections.open >= self._connections.limit:
            self._refused = True
            # uvloop's transports are not asyncio.Transport subclasses, but quack alike.
            writable = cast(asyncio.Transport, transport)
            writable.write(OVER_CAPACITY)
            writable.close()
            self._observer.connection_refused()
            return
        self._connections.open += 1
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return
        self._connections.open -= 1
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        if self._request_read():
            self._disarm()
        else:
            self._arm()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The parser's own refusals (and anything unhandled), as JSON."""
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already sent on this connection")
        body: dict[str, str] = {"error": _CODES.get(status, "invalid_request")}
        if isinstance(exc, ContentEncodingError):
            # aiohttp's words name a module to install ("Please install
            # `Brotli`"): the client is told what it may send instead.
            message = UNDECODED
        if message:
            body["detail"] = message
        resp = web.Response(body=orjson.dumps(body), status=status, content_type="application/json")
        resp.force_close()
        return resp

    def _request_read(self) -> bool:
        """Whether the request being read has arrived whole (head and body)."""
        if self._messages:
            return self._messages[-1][1].is_eof()
        if self._current_request is not None:
            return self._current_request.content.is_eof()
        return False

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self._loop.call_later(self._read_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self._request_read() or self.transport is None:
            return
        self._observer.read_timed_out()
        log.debug("request_read_timeout", seconds=self._read_timeout_s)
        request = self._current_request
        if request is None and not self._messages:
            # The head is incomplete, so no handler runs: say why before closing.
            self.transport.write(READ_TIMEOUT)
        elif request is not None and not self._messages and request.writer.output_size == 0:
            # A whole head, a body still short, nothing answered: the handler's
            # read of the body fails with this and it answers 408 and closes
            # (gateway.http.views.read_body). A handler that never reads it ends
            # in aiohttp's lingering read, which takes a TimeoutError as its end.
            request.content.set_exception(BodyTimeout(self._read_timeout_s))
            return
        self.force_close()


class LimitedSite(web.BaseSite):
    """A TCP site (SO_REUSEPORT) serving :class:`LimitedHandler` connections."""

    def __init__(
        self, runner: web.BaseRunner, settings: Settings, observer: LimitsObserver = UNOBSERVED
    ) -> None:
        super().__init__(runner, backlog=BACKLOG)
        self._host, self._port = settings.host, settings.port
        self._connections = Connections(settings.max_connections)
        self._read_timeout_s = settings.request_read_timeout_s
        self._observer = observer

    @property
    def name(self) -> str:
        """The URL served."""
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        """Listen, building one limited handler per connection."""
        await super().start()
        loop = asyncio.get_running_loop()
        manager = self._runner.server
        assert manager is not None

        def handler() -> LimitedHandler:
            return LimitedHandler(
                manager,
                connections=self._connections,
                read_timeout_s=self._read_timeout_s,
                observer=self._observer,
                loop=loop,
                access_log=None,
                max_line_size=MAX_LINE_SIZE,
                max_field_size=MAX_FIELD_SIZE,
                max_headers=MAX_HEADERS,
            )

        self._server = await loop.create_server(
            handler, self._host, self._port, backlog=self._backlog, reuse_port=True
        )
