"""The middleware: errors become JSON bodies with a stable code; answers are counted and timed.

It wraps every request, so it is also where the request's client address is
bound for its log lines (lazily: no header is parsed unless a line is
written, see gateway.http.clients).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

import orjson
import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from redis.exceptions import RedisError

from gateway.domain.errors import (
    ClientGone,
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    TooLarge,
    Unavailable,
)
from gateway.http.clients import TrustedProxies, bind_request
from gateway.http.payloads import MAX_BODY
from gateway.lock import LockError, closed_under_write
from gateway.ops.answer_log import AnswerLog
from gateway.ops.metrics import Metrics
from gateway.postgres.database import DB_ERRORS

log = structlog.get_logger(__name__)

# A purchase response carries its outcome to the metrics (read by the answering below).
OUTCOME = web.ResponseKey("outcome", str)
# The outcome of a purchase whose client went away before its body arrived.
CLIENT_GONE = "client_gone"

JSON = "application/json"
_INTERNAL = orjson.dumps({"error": "internal"})


def error_body(error: GatewayError) -> web.Response:
    """The JSON response of a gateway error."""
    resp = web.Response(
        body=orjson.dumps(error.body()),
        status=error.status,
        content_type=JSON,
        headers=error.headers,
    )
    if error.status in (409, 429):
        # A sale's answer (not_started, ended, rate_limited), counted by its name.
        resp[OUTCOME] = error.code
    if error.close_connection:
        resp.force_close()
    return resp


def _from_http(exc: web.HTTPException) -> GatewayError:
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        # aiohttp refuses a body over the app's client_max_size, which is MAX_BODY.
        return TooLarge(f"body over {MAX_BODY} bytes")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(f"{exc.method} is not allowed here")
    if isinstance(exc, web.HTTPNotFound):
        return NotFound("no such route")
    error = GatewayError(exc.reason)
    error.status, error.code = exc.status, exc.reason.lower().replace(" ", "_")
    return error


def _failure(request: web.Request, exc: Exception, answers: AnswerLog) -> web.Response:
    """The JSON answer of a handler's exception; 5xx are logged through ``answers``."""
    if isinstance(exc, ClientGone):
        # The buyer's doing, not a fault of ours: counted apart from failures,
        # and logged below the level anyone is paged at.
        log.debug("client_gone", path=request.path, detail=exc.detail, cause=repr(exc.__cause__))
        resp = error_body(exc)
        resp[OUTCOME] = CLIENT_GONE
        return resp
    if isinstance(exc, GatewayError):
        if exc.status >= 500:
            answers.failure(path=request.path, error=exc.code, cause=str(exc))
        return error_body(exc)
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        return error_body(_from_http(exc))
    if isinstance(exc, (RedisError, LockError, *DB_ERRORS)) or closed_under_write(exc):
        # A driver error that crossed the lock package: a dependency is down,
        # which is a 503, never a 500. DB_ERRORS holds OSError, which the
        # client's own connection raises too: that one never gets here, since
        # reading the body (gateway.http.views.read_body) makes it ClientGone.
        answers.failure(path=request.path, error="unavailable", cause=repr(exc))
        return error_body(Unavailable(f"dependency: {type(exc).__name__}"))
    log.exception("unhandled", path=request.path, exc_info=exc)
    return web.Response(body=_INTERNAL, status=500, content_type=JSON)


def _outcome(resp: web.StreamResponse) -> str:
    tagged = resp.get(OUTCOME)
    if tagged is not None:
        return str(tagged)
    status = resp.status
    if status == 503:
        return "unavailable"
    if status == 429:
        return "rate_limited"
    if status in (401, 403):
        return "unauthorized"
    if status >= 400:
        return "invalid"
    return "ok"


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


# Answer a request through a handler, for the route given (None: the route
# the router matched, read once the handler is done).
Answer = Callable[[web.Request, Handler, str | None], Awaitable[web.StreamResponse]]


def answering(
    proxies: TrustedProxies, metrics: Metrics, answers: AnswerLog, *, timed: bool
) -> Answer:
    """What wraps every request, through the middleware or the fast path:
    binds the request for its log lines, answers every failure as JSON (nothing
    escapes as an HTML page or a bare 500), and counts the answer by outcome,
    timed when ``timed`` (metrics on)."""
    record, count = metrics.request, metrics.stats.count

    async def timing(
        request: web.Request, handler: Handler, route: str | None
    ) -> web.StreamResponse:
        started = time.perf_counter()
        bind_request(request, proxies)
        try:
            resp = await handler(request)
        except Exception as exc:
            resp = _failure(request, exc, answers)
        record(route or _route(request), _outcome(resp), time.perf_counter() - started)
        return resp

    async def untimed(
        request: web.Request, handler: Handler, route: str | None
    ) -> web.StreamResponse:
        bind_request(request, proxies)
        try:
            resp = await handler(request)
        except Exception as exc:
            resp = _failure(request, exc, answers)
        count(route or _route(request), _outcome(resp))
        return resp

    return timing if timed else untimed


def gateway_middleware(answer: Answer, queries: Mapping[str, frozenset[str]]) -> Middleware:
    """The one middleware of every route the router serves (see :func:`answering`).

    ``queries`` are the query parameters each route (by its canonical path)
    takes: any other is a 400, as an unknown body field is. The fast path
    serves no query string, so its requests pay nothing for this."""
    nothing: frozenset[str] = frozenset()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            request.query_string
            and request.match_info.route.resource is not None
            and not request.query.keys() <= queries.get(_route(request), nothing)
        ):
            handler = _unknown_query
        return await answer(request, handler, None)

    return middleware


async def _unknown_query(request: web.Request) -> web.StreamResponse:
    """The handler of a request with a query parameter its route does not take."""
    raise InvalidRequest(f"unknown query parameters: {', '.join(sorted(set(request.query)))}")
