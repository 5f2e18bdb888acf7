"""HTTP handlers of the admin routes: the bearer token checked, every change
and every refusal logged once, after the fact (``admin_change``, ``admin_refused``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from gateway.domain.errors import Forbidden, GatewayError, Unauthorized
from gateway.http import payloads
from gateway.http.appkeys import ADMIN, ADMIN_TOKENS, RECONCILER
from gateway.http.views import json_response, read_body
from gateway.usecases.admin import StockAdmin

log = structlog.get_logger(__name__)


def check_admin(request: web.Request) -> str:
    """The fingerprint of the request's admin bearer token, once it checks out
    (in constant time); raises :class:`Forbidden` or :class:`Unauthorized`."""
    return _admin(request)[1]


def _admin(request: web.Request) -> tuple[StockAdmin, str]:
    """The admin use cases and the fingerprint of the bearer token, once it checks
    out (in constant time); raises :class:`Forbidden` or :class:`Unauthorized`."""
    tokens = request.app[ADMIN_TOKENS]
    if not tokens.configured:
        raise Forbidden("admin routes are off: GATEWAY_ADMIN_TOKEN(_FILE) is not set")
    fingerprint = tokens.check(request.headers.get("Authorization", ""))
    if fingerprint is None:
        raise Unauthorized("missing or wrong bearer token")
    return request.app[ADMIN], fingerprint


# An admin change: given the request and the use cases, the answer and what it
# changed (logged as admin_change).
Change = Callable[[web.Request, StockAdmin], Awaitable[tuple[Any, dict[str, Any]]]]


def admin_change(change: Change) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An admin route that changes something: one ``admin_change`` line per change
    that took effect (what it set, old and new, and the token's fingerprint,
    never the token); one ``admin_refused`` line, with its status, per request
    refused."""
    name = change.__name__

    async def handle(request: web.Request) -> web.Response:
        token: str | None = None
        try:
            admin, token = _admin(request)
            answer, done = await change(request, admin)
        except GatewayError as exc:
            log.info(
                "admin_refused",
                change=name,
                path=request.path,
                status=exc.status,
                error=exc.code,
                token=token,
            )
            raise
        log.info("admin_change", change=name, path=request.path, token=token, **done)
        return json_response(answer)

    handle.__name__ = handle.__qualname__ = name
    return handle


@admin_change
async def put_sku(request: web.Request, admin: StockAdmin) -> tuple[Any, dict[str, Any]]:
    """PUT /admin/skus/{sku}: create the sku or set every field of it (an absent
    field takes its default); its remaining stock is reset, orders stay."""
    return await _change_sku(request, admin, whole=True)


@admin_change
async def patch_sku(request: web.Request, admin: StockAdmin) -> tuple[Any, dict[str, Any]]:
    """PATCH /admin/skus/{sku}: change only the fields given, of a sku that exists."""
    return await _change_sku(request, admin, whole=False)


async def _change_sku(
    request: web.Request, admin: StockAdmin, *, whole: bool
) -> tuple[Any, dict[str, Any]]:
    """Set the body's fields on the path's sku: all of them, creating it
    (``whole``), or only those given."""
    sku = payloads.identifier(request.match_info["sku"], "sku")
    data = payloads.parse_object(await read_body(request), payloads.SKU_FIELDS)
    fields = payloads.sku_fields(data, partial=not whole)
    return await admin.change_sku(sku, fields, create=whole)


@admin_change
async def restock(request: web.Request, admin: StockAdmin) -> tuple[Any, dict[str, Any]]:
    """POST /admin/skus/{sku}/restock: add stock."""
    sku = payloads.identifier(request.match_info["sku"], "sku")
    data = payloads.parse_object(await read_body(request), payloads.RESTOCK_FIELDS)
    delta = payloads.integer(data, "delta", low=1)
    answer = await admin.restock(sku, delta)
    stock = answer["stock"]
    return answer, {"sku": sku, "set": {"stock": [stock - delta, stock]}}


async def sku_report(request: web.Request) -> web.Response:
    """GET /admin/skus/{sku}: database and Redis stock, pending and sold units."""
    admin, _ = _admin(request)
    report = await admin.report(payloads.identifier(request.match_info["sku"], "sku"))
    return json_response(
        {
            "db_stock": report.db_stock,
            "redis_stock": report.redis_stock,
            "pending": report.pending,
            "sold": report.sold,
        }
    )


@admin_change
async def reconcile(request: web.Request, admin: StockAdmin) -> tuple[Any, dict[str, Any]]:
    """POST /admin/reconcile: run a reconciliation pass now; what it did per sku."""
    done = {sku: r.as_json() for sku, r in (await request.app[RECONCILER].reconcile_all()).items()}
    return done, {"skus": len(done)}


def routes() -> list[web.RouteDef]:
    """The admin routes."""
    return [
        web.put("/admin/skus/{sku}", put_sku),
        web.patch("/admin/skus/{sku}", patch_sku),
        web.post("/admin/skus/{sku}/restock", restock),
        web.get("/admin/skus/{sku}", sku_report),
        web.post("/admin/reconcile", reconcile),
    ]
