"""Middlewares: errors become JSON bodies with a stable code; metrics time requests.

The error middleware wraps every request, so it is also where the request's
client address is bound for its log lines (lazily: no header is parsed unless
a line is written, see gateway.clients).
"""

from __future__ import annotations

import time

import orjson
import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from redis.exceptions import RedisError

from gateway.appkeys import OUTCOME, PROXIES
from gateway.clients import bind_request
from gateway.errors import GatewayError, MethodNotAllowed, NotFound, TooLarge, Unavailable
from gateway.lock.errors import LockError
from gateway.metrics import Metrics
from gateway.orders import DB_ERRORS

log = structlog.get_logger(__name__)

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
        return TooLarge("body over 4096 bytes")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(f"{exc.method} is not allowed here")
    if isinstance(exc, web.HTTPNotFound):
        return NotFound("no such route")
    error = GatewayError(exc.reason)
    error.status, error.code = exc.status, exc.reason.lower().replace(" ", "_")
    return error


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer every failure as JSON; nothing escapes as an HTML page or a bare 500."""
    bind_request(request, request.app[PROXIES])
    try:
        return await handler(request)
    except GatewayError as exc:
        if exc.status >= 500:
            log.warning("request_failed", path=request.path, error=exc.code, cause=str(exc))
        return error_body(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_body(_from_http(exc))
    except (RedisError, LockError, *DB_ERRORS) as exc:
        # A driver error that crossed the lock package: a dependency is down,
        # which is a 503, never a 500.
        log.warning("request_failed", path=request.path, error="unavailable", cause=repr(exc))
        return error_body(Unavailable(f"dependency: {type(exc).__name__}"))
    except Exception:
        log.exception("unhandled", path=request.path)
        return web.Response(body=_INTERNAL, status=500, content_type=JSON)


def _outcome(resp: web.StreamResponse) -> str:
    tagged = resp.get(OUTCOME)
    if tagged is not None:
        return str(tagged)
    status = resp.status
    if status == 503:
        return "unavailable"
    if status in (401, 403):
        return "unauthorized"
    if status >= 400:
        return "invalid"
    return "ok"


def measure(metrics: Metrics) -> Middleware:
    """A middleware recording latency by route and outcome (outermost)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        resp = await handler(request)
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        metrics.request(route, _outcome(resp), time.perf_counter() - started)
        return resp

    return middleware
