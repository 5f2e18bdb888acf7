"""HTTP handlers of the admin routes: the bearer token checked, every change
and every refusal logged once, after the fact (``admin_change``, ``admin_refused``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from gateway.domain.errors import Forbidden, GatewayError, InvalidRequest, Unauthorized
from gateway.domain.skus import IfMissing
from gateway.http import payloads
from gateway.http.appkeys import ADMIN, ADMIN_TOKENS, RECONCILER, WAITING_PAGE
from gateway.http.params import header, query_int
from gateway.http.views import json_response, read_body
from gateway.http.waiting_page import check_image_url
from gateway.usecases.admin import StockAdmin

log = structlog.get_logger(__name__)

# GET /admin/skus: which skus a page shows, and how many at most.
SKU_STATUSES = ("active", "idle", "archived", "all")
PAGE_MAX = 1000
PAGE_DEFAULT = 100
# The query parameters each admin route takes (by its path); the others take none.
QUERIES = {"/admin/skus": frozenset({"status", "after", "limit"})}


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
    fingerprint = tokens.check(header(request.headers, "Authorization") or "")
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
    return await _change_sku(request, admin, IfMissing.CREATE)


@admin_change
async def patch_sku(request: web.Request, admin: StockAdmin) -> tuple[Any, dict[str, Any]]:
    """PATCH /admin/skus/{sku}: change only the fields given, of a sku that exists."""
    return await _change_sku(request, admin, IfMissing.REFUSE)


async def _change_sku(
    request: web.Request, admin: StockAdmin, if_missing: IfMissing
) -> tuple[Any, dict[str, Any]]:
    """Set the body's fields on the path's sku: all of them, creating it
    (``PUT``: ``IfMissing.CREATE``), or only those given (``PATCH``)."""
    sku = payloads.identifier(request.match_info["sku"], "sku")
    data = payloads.parse_object(await read_body(request), payloads.SKU_FIELDS)
    fields = payloads.sku_fields(data, partial=if_missing is IfMissing.REFUSE)
    check_image_url(fields.get("image_url"), request.app[WAITING_PAGE].image_origins)
    return await admin.change_sku(sku, fields, if_missing=if_missing)


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
    """GET /admin/skus/{sku}: every setting a PUT takes, the sku's status, and
    its counts (stock in both stores, pending, sold and its split)."""
    admin, _ = _admin(request)
    sku = payloads.identifier(request.match_info["sku"], "sku")
    return json_response(await admin.sheet(sku))


@admin_change
async def archive_sku(request: web.Request, admin: StockAdmin) -> tuple[Any, dict[str, Any]]:
    """DELETE /admin/skus/{sku}: archive the sku (again: the same answer)."""
    return await admin.archive(payloads.identifier(request.match_info["sku"], "sku"))


async def list_skus(request: web.Request) -> web.Response:
    """GET /admin/skus?status=&after=&limit=: a page of skus by name, and the
    cursor (``next``) that the next page's ``after`` takes."""
    admin, _ = _admin(request)
    query = request.query
    status = query.get("status", "all")
    if status not in SKU_STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(SKU_STATUSES)}")
    after = query.get("after")
    if after is not None:
        payloads.identifier(after, "after")
    limit = query_int(query, "limit", low=1, high=PAGE_MAX, default=PAGE_DEFAULT)
    return json_response(await admin.skus(status, after or "", limit))


@admin_change
async def reconcile(request: web.Request, admin: StockAdmin) -> tuple[Any, dict[str, Any]]:
    """POST /admin/reconcile: run a reconciliation pass now; what it did per sku."""
    done = {sku: r.as_json() for sku, r in (await request.app[RECONCILER].reconcile_all()).items()}
    return done, {"skus": len(done)}


@admin_change
async def put_limit_group(request: web.Request, admin: StockAdmin) -> tuple[Any, dict[str, Any]]:
    """PUT /admin/limit-groups/{group}: create the group or set its limit."""
    name = payloads.identifier(request.match_info["group"], "group")
    data = payloads.parse_object(await read_body(request), payloads.GROUP_FIELDS)
    limit = payloads.integer(data, "per_user_limit", low=1, high=payloads.MAX_GROUP_LIMIT)
    return await admin.limit_groups.put(name, limit)


async def get_limit_group(request: web.Request) -> web.Response:
    """GET /admin/limit-groups/{group}: the group, its limit and its skus."""
    admin, _ = _admin(request)
    name = payloads.identifier(request.match_info["group"], "group")
    return json_response(await admin.limit_groups.get(name))


@admin_change
async def delete_limit_group(request: web.Request, admin: StockAdmin) -> tuple[Any, dict[str, Any]]:
    """DELETE /admin/limit-groups/{group}: 409 group_in_use while a sku is in it."""
    name = payloads.identifier(request.match_info["group"], "group")
    return await admin.limit_groups.delete(name)


def routes() -> list[web.RouteDef]:
    """The admin routes."""
    return [
        web.put("/admin/limit-groups/{group}", put_limit_group),
        web.get("/admin/limit-groups/{group}", get_limit_group),
        web.delete("/admin/limit-groups/{group}", delete_limit_group),
        web.put("/admin/skus/{sku}", put_sku),
        web.patch("/admin/skus/{sku}", patch_sku),
        web.post("/admin/skus/{sku}/restock", restock),
        web.get("/admin/skus/{sku}", sku_report),
        web.delete("/admin/skus/{sku}", archive_sku),
        web.get("/admin/skus", list_skus),
        web.post("/admin/reconcile", reconcile),
    ]
