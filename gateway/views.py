"""HTTP handlers: thin, parse and answer; the use cases do the work."""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from aiohttp import web

from gateway import payloads
from gateway.admin import StockAdmin
from gateway.appkeys import (
    ADMIN,
    BATCHER,
    INVENTORY,
    METRICS,
    ORDERS,
    OUTCOME,
    PURCHASES,
    RECONCILER,
    SETTINGS,
    STOPPING,
)
from gateway.clients import current_client
from gateway.domain import Outcome, Result
from gateway.errors import Forbidden, NotFound, TooLarge, Unauthorized
from gateway.metrics import CONTENT_TYPE

JSON = "application/json"
_SOLD_OUT = orjson.dumps({"status": "sold_out"})
_DUPLICATE = orjson.dumps({"status": "duplicate"})
_IN_PROGRESS = orjson.dumps({"status": "in_progress"})


def json_response(
    data: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON response rendered by orjson."""
    return web.Response(body=orjson.dumps(data), status=status, content_type=JSON, headers=headers)


async def read_body(request: web.Request) -> bytes:
    """The body, refusing more than 4 KiB before reading it when the length is declared."""
    if (request.content_length or 0) > payloads.MAX_BODY:
        raise TooLarge(f"body over {payloads.MAX_BODY} bytes")
    return await request.read()


def purchase_response(result: Result) -> web.Response:
    """The HTTP answer of a purchase outcome, tagged with it for the metrics."""
    if result.outcome is Outcome.CONFIRMED and result.order is not None:
        resp = json_response({"status": "confirmed", **result.order.as_json()}, status=201)
    elif result.outcome is Outcome.SOLD_OUT:
        resp = web.Response(body=_SOLD_OUT, status=409, content_type=JSON)
    elif result.outcome is Outcome.DUPLICATE:
        resp = web.Response(body=_DUPLICATE, status=409, content_type=JSON)
    else:
        resp = web.Response(
            body=_IN_PROGRESS, status=409, content_type=JSON, headers={"Retry-After": "1"}
        )
    resp[OUTCOME] = result.outcome.value
    return resp


async def purchase(request: web.Request) -> web.Response:
    """POST /v1/purchase."""
    body = await read_body(request)
    p = payloads.purchase(body, request.headers.get("Idempotency-Key"))
    # The client address is worked out only if a client rate limit applies:
    # nothing is parsed or allocated for it on the sold-out path.
    return purchase_response(await request.app[PURCHASES].purchase(p, current_client))


async def get_order(request: web.Request) -> web.Response:
    """GET /v1/orders/{request_id}."""
    request_id = payloads.identifier(request.match_info["request_id"], "request_id")
    order = await request.app[ORDERS].order(request_id)
    if order is None:
        raise NotFound(f"no order for request {request_id!r}")
    return json_response(order.as_json())


async def get_sku(request: web.Request) -> web.Response:
    """GET /v1/skus/{sku}: what Redis has left to reserve."""
    sku = payloads.identifier(request.match_info["sku"], "sku")
    available = await request.app[PURCHASES].available(sku)
    rules = await request.app[PURCHASES].rules(sku)
    return json_response({"sku": sku, "available": available, **rules.window_json()})


def _admin(request: web.Request) -> StockAdmin:
    """The admin use cases, once the bearer token checks out (in constant time)."""
    token = request.app[SETTINGS].admin_token
    if token is None:
        raise Forbidden("admin routes are off: GATEWAY_ADMIN_TOKEN is not set")
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        raise Unauthorized("missing or wrong bearer token")
    return request.app[ADMIN]


async def put_sku(request: web.Request) -> web.Response:
    """PUT /admin/skus/{sku}: create the sku or reset its remaining stock."""
    admin = _admin(request)
    sku = payloads.identifier(request.match_info["sku"], "sku")
    data = payloads.parse_object(await read_body(request), payloads.SKU_FIELDS)
    stock = payloads.integer(data, "stock", low=0)
    limit = payloads.integer(data, "per_user_limit", low=1, high=payloads.MAX_LIMIT, default=1)
    rules = payloads.sale_rules(data)
    return json_response(await admin.put_sku(sku, stock, limit, rules))


async def restock(request: web.Request) -> web.Response:
    """POST /admin/skus/{sku}/restock: add stock."""
    admin = _admin(request)
    sku = payloads.identifier(request.match_info["sku"], "sku")
    data = payloads.parse_object(await read_body(request), payloads.RESTOCK_FIELDS)
    return json_response(await admin.restock(sku, payloads.integer(data, "delta", low=1)))


async def sku_report(request: web.Request) -> web.Response:
    """GET /admin/skus/{sku}: database and Redis stock, pending and sold units."""
    admin = _admin(request)
    report = await admin.report(payloads.identifier(request.match_info["sku"], "sku"))
    return json_response(
        {
            "db_stock": report.db_stock,
            "redis_stock": report.redis_stock,
            "pending": report.pending,
            "sold": report.sold,
        }
    )


async def reconcile(request: web.Request) -> web.Response:
    """POST /admin/reconcile: run a reconciliation pass now; what it did per sku."""
    _admin(request)
    done = await request.app[RECONCILER].reconcile_all()
    return json_response({sku: r.as_json() for sku, r in done.items()})


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz: the process answers."""
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """GET /readyz: 200 while Redis and PostgreSQL answer and no stop has begun
    (``draining`` covers the lame duck too: purchases are still served then)."""
    redis_ok = await request.app[INVENTORY].ping()
    db_ok = await request.app[ORDERS].ping()
    draining = request.app[STOPPING].is_set() or request.app[BATCHER].closing
    ready = redis_ok and db_ok and not draining
    body = {"ready": ready, "redis": redis_ok, "postgres": db_ok, "draining": draining}
    return json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text exposition."""
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def routes(with_metrics: bool) -> list[web.RouteDef]:
    """Every route of the API."""
    return [
        web.post("/v1/purchase", purchase),
        web.get("/v1/orders/{request_id}", get_order),
        web.get("/v1/skus/{sku}", get_sku),
        web.put("/admin/skus/{sku}", put_sku),
        web.post("/admin/skus/{sku}/restock", restock),
        web.get("/admin/skus/{sku}", sku_report),
        web.post("/admin/reconcile", reconcile),
        web.get("/healthz", healthz),
        web.get("/readyz", readyz),
        *([web.get("/metrics", metrics)] if with_metrics else []),
    ]
