"""The bare baseline: aiohttp + uvloop + orjson and nothing else.

``python -m loadtests.baselines.bare --port P`` serves ``POST /v1/purchase``, which
reads, parses and validates the same body the gateway takes and answers
``409 {"status": "sold_out"}``: no Redis, no PostgreSQL, no middleware. It is
the ceiling the gateway's sold-out path is measured against, so it must stay
as cheap as the framework allows; it deliberately does not import ``gateway``,
so optimising the gateway never moves the baseline.

With ``--minimal`` the handler only parses the body with orjson (a 400 when
it is not JSON) and answers 409: the floor of any aiohttp + uvloop + orjson
purchase route, and the reference issue 14's targets are measured against.
"""

from __future__ import annotations

import argparse
import re
import uuid
from collections.abc import Sequence
from typing import Any

import orjson
import uvloop
from aiohttp import web

JSON = "application/json"
MAX_BODY = 4096
MAX_QTY = 2**31 - 1
FIELDS = frozenset({"sku", "user_id", "qty", "request_id"})
ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,64}")
SOLD_OUT = orjson.dumps({"status": "sold_out"})
_HEALTHY = orjson.dumps({"status": "ok"})


class BadRequest(ValueError):
    """The body is not a valid purchase."""


def parse_purchase(body: bytes) -> dict[str, Any]:
    """Parse and validate a purchase body by the gateway's rules.

    Returns ``{"sku", "user_id", "qty", "request_id"}`` (the request id is
    generated when absent, as the gateway does); raises :class:`BadRequest`.
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadRequest("body is not valid JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    if data.keys() - FIELDS:
        raise BadRequest("unknown fields")
    for name in ("sku", "user_id"):
        value = data.get(name)
        if not isinstance(value, str) or ID_PATTERN.fullmatch(value) is None:
            raise BadRequest(f"{name} must be an id")
    qty = data.get("qty", 1)
    # bool is a subclass of int; JSON true is not a quantity.
    if type(qty) is not int or not 1 <= qty <= MAX_QTY:
        raise BadRequest("qty must be a positive integer")
    request_id = data.get("request_id")
    if request_id is None:
        request_id = uuid.uuid4().hex
    elif not isinstance(request_id, str) or ID_PATTERN.fullmatch(request_id) is None:
        raise BadRequest("request_id must be an id")
    return {"sku": data["sku"], "user_id": data["user_id"], "qty": qty, "request_id": request_id}


def bad_request(exc: BadRequest) -> web.Response:
    """The 400 answer of a body that failed validation."""
    body = orjson.dumps({"error": "invalid_request", "detail": str(exc)})
    return web.Response(body=body, status=400, content_type=JSON)


async def read_body(request: web.Request) -> bytes | None:
    """The body, or None when its declared length is over the limit."""
    if (request.content_length or 0) > MAX_BODY:
        return None
    return await request.read()


async def purchase(request: web.Request) -> web.Response:
    """POST /v1/purchase: validate, then always sold out."""
    body = await read_body(request)
    if body is None:
        return web.Response(status=413)
    try:
        parse_purchase(body)
    except BadRequest as exc:
        return bad_request(exc)
    return web.Response(body=SOLD_OUT, status=409, content_type=JSON)


async def minimal_purchase(request: web.Request) -> web.Response:
    """POST /v1/purchase with ``--minimal``: parse the body, then always sold out."""
    try:
        orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return web.Response(status=400)
    return web.Response(body=SOLD_OUT, status=409, content_type=JSON)


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz: the process answers."""
    return web.Response(body=_HEALTHY, content_type=JSON)


def create_app(minimal: bool = False) -> web.Application:
    """The bare application (``minimal``: parse only, no validation)."""
    app = web.Application(client_max_size=MAX_BODY)
    handler = minimal_purchase if minimal else purchase
    app.add_routes([web.post("/v1/purchase", handler), web.get("/healthz", healthz)])
    return app


def serve(app: web.Application, host: str, port: int) -> None:
    """Run ``app`` on uvloop without an access log, as the gateway runs."""
    web.run_app(
        app,
        host=host,
        port=port,
        access_log=None,
        print=None,
        loop=uvloop.new_event_loop(),
        shutdown_timeout=1.0,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m loadtests.baselines.bare``."""
    parser = argparse.ArgumentParser(prog="python -m loadtests.baselines.bare", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--minimal", action="store_true", help="parse the body only")
    args = parser.parse_args(argv)
    serve(create_app(args.minimal), args.host, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
