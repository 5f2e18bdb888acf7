"""The purchase fast path: ``POST /v1/purchase`` answered beside aiohttp's application layer.

The sold-out answer is the one a storm gets most, and its own work is a dict
lookup; a profile puts most of its cost in aiohttp's per-request layers. For
every request, aiohttp's ``Application._handle`` resolves the route in the
router, builds and freezes a ``UrlMappingMatchInfo``, wraps the handler in the
middleware chain (a ``partial`` per middleware plus the wrapper that sets the
request's current app), and only then calls the view.

The fast path is the request handler of the listening server
(``web.Server.request_handler``, set by :func:`install` after start-up). It
sends a plain ``POST /v1/purchase`` straight to the view, bound to the use
cases, through the same answering code as the middleware (errors as JSON,
outcome counted and timed). Every other request, a purchase with ``Expect:
100-continue`` or a query string included, goes to the application as before.
What a client sees is the same either way; ``tests/e2e/test_fastpath.py`` holds
both paths to that. A client gone before aiohttp's own ``100 Continue`` could
be written to it is answered here as the middleware answers a client gone
during its handler (the outcome ``client_gone``).

``request_handler`` is not a documented setting: aiohttp's protocol copies it
when a connection is accepted, which is why a swap after start-up takes effect.
aiohttp is pinned to the release that does so, and
``tests/unit/test_library_reaches.py`` fails when it stops.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import hdrs, web

from gateway.domain.errors import ClientGone, ExpectationFailed, GatewayError, TooLarge
from gateway.http.appkeys import ADMISSIONS, ANSWER, PURCHASES
from gateway.http.payloads import MAX_BODY
from gateway.http.views import buy
from gateway.ops.request_stats import PURCHASE_ROUTE

_POST = hdrs.METH_POST

# What a web.Server calls per request.
ServerHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def install(app: web.Application, server: web.Server) -> None:
    """Put the fast path in front of ``app`` on ``server``: connections accepted from
    now on are served through it."""
    server.request_handler = fast_path(app, server.request_handler)


def fast_path(app: web.Application, handle: ServerHandler) -> ServerHandler:
    """A request handler: plain purchases to the view, the rest to ``handle``."""
    answer = app[ANSWER]
    # Bound once: the use cases exist from start-up, before the first connection.
    purchase = functools.partial(buy, admissions=app[ADMISSIONS], purchases=app[PURCHASES])

    async def serve(request: web.BaseRequest) -> web.StreamResponse:
        # raw_path is the request line's target as sent: a query string or an
        # escaped spelling goes through the router, which answers it as before.
        if (
            request.raw_path == PURCHASE_ROUTE
            and request.method == _POST
            and hdrs.EXPECT not in request.headers
        ):
            # An application runner's server builds web.Request objects.
            return await answer(cast(web.Request, request), purchase, PURCHASE_ROUTE)
        refusal = _expectation(request)
        if refusal is not None:
            # Answered before the application, whose expect handler would
            # write "100 Continue" (or a text/plain 417) ahead of the middleware.
            # Whether the client sends its body now is its guess: the body
            # is not waited for, and the connection closes after the answer.
            request.content.feed_eof()
            refusal.close_connection = True
            route = await _route_of(app, request)
            refused = functools.partial(_raise, refusal)
            return await answer(cast(web.Request, request), refused, route)
        try:
            return await handle(request)
        except ConnectionResetError as exc:
            # Raised by aiohttp's own write ahead of the middleware: the "100
            # Continue" of an Expect: 100-continue request, to a client already
            # gone. Answered (to nobody) and counted as a handler's would be,
            # not logged as an error with its traceback.
            gone = ClientGone("the connection was lost before the body was asked for")
            gone.__cause__ = exc
            return await answer(cast(web.Request, request), functools.partial(_raise, gone), None)

    return serve


def _expectation(request: web.BaseRequest) -> GatewayError | None:
    """The refusal of a request's ``Expect`` header, or None to go on: any
    expectation but ``100-continue`` is a 417, and a declared body over
    MAX_BODY a 413 before the client is told to send it."""
    expect = request.headers.get(hdrs.EXPECT)
    if expect is None:
        return None
    if expect.lower() != "100-continue":
        return ExpectationFailed("the only expectation taken is 100-continue")
    if (request.content_length or 0) > MAX_BODY:
        return TooLarge(f"body over {MAX_BODY} bytes")
    return None


async def _route_of(app: web.Application, request: web.BaseRequest) -> str:
    """The canonical route of a request the router has not seen yet, for the
    metrics' label (an unknown path is ``unmatched``, as the middleware counts it)."""
    resource = (await app.router.resolve(cast(web.Request, request))).route.resource
    return resource.canonical if resource is not None else "unmatched"


async def _raise(error: GatewayError, request: web.Request) -> web.StreamResponse:
    """A handler that fails with ``error``."""
    raise error
