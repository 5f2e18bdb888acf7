"""HTTP handlers of the shop's payment service: an order's pay, cancel and
refund, a buyer's orders, and the late payments it refunds. Authorised by
``Authorization: Bearer <GATEWAY_PAYMENT_TOKEN>`` (not the admin token).
An admin cancels or refunds an order through ``POST /admin/orders/{request_id}/
cancel`` and ``/refund`` (the admin token, logged as an admin change; its event
says ``cause: admin``), and lists the late payments as the payment service does
(``GET /admin/late-payments``)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gateway.domain.errors import InvalidRequest, PaymentUnauthorized
from gateway.domain.model import Cause, OrderStatus
from gateway.domain.payments import LateStatus, OrderCursor
from gateway.http import payloads
from gateway.http.admin_views import admin_change, check_admin
from gateway.http.appkeys import LIFECYCLE, SETTINGS
from gateway.http.params import header, query_int
from gateway.http.views import json_response, read_body
from gateway.usecases.admin import StockAdmin

PAY_FIELDS = frozenset({"payment_id"})
CANCEL_FIELDS = frozenset({"reason"})
REFUND_FIELDS = frozenset({"restock", "reason"})
# The caller's words on a cancel or a refund, carried by its event.
REASON_MAX = 200
# Items listed per page at most, and when ``limit`` is not given.
PAGE_MAX = 1000
PAGE_DEFAULT = 100
# The query parameters each route takes (by its path).
_PAGE = frozenset({"status", "after", "limit"})
QUERIES = {
    "/admin/late-payments": _PAGE,
    "/v1/late-payments": _PAGE,
    "/v1/orders": _PAGE | {"user_id", "sku"},
}
# The last seq a cursor may name (a bigint).
SEQ_MAX = 2**63 - 1


def _check_payer(request: web.Request) -> None:
    """Raise :class:`PaymentUnauthorized` unless the payment token is given
    (compared in constant time); none configured opens nothing."""
    token = request.app[SETTINGS].payment_token
    given = (header(request.headers, "Authorization") or "").encode()
    if token is None or not hmac.compare_digest(given, f"Bearer {token}".encode()):
        raise PaymentUnauthorized("missing or wrong payment bearer token")


async def pay(request: web.Request) -> web.Response:
    """POST /v1/orders/{request_id}/pay with ``{"payment_id": "..."}``: 200 paid."""
    _check_payer(request)
    request_id = payloads.identifier(request.match_info["request_id"], "request_id")
    data = payloads.parse_object(await read_body(request), PAY_FIELDS)
    if "payment_id" not in data:
        raise InvalidRequest("payment_id is required")
    payment_id = payloads.identifier(data["payment_id"], "payment_id")
    order = await request.app[LIFECYCLE].pay(request_id, payment_id)
    return json_response(order.as_json())


async def cancel(request: web.Request) -> web.Response:
    """POST /v1/orders/{request_id}/cancel ``{"reason"?}``: 200 cancelled, its
    units back on sale."""
    _check_payer(request)
    return json_response(await _cancel(request, Cause.BUYER))


async def refund(request: web.Request) -> web.Response:
    """POST /v1/orders/{request_id}/refund ``{"restock": bool, "reason"?}``: 200
    refunded, its units back on sale with ``restock``."""
    _check_payer(request)
    return json_response(await _refund(request, Cause.PAYMENT))


@admin_change
async def admin_cancel(request: web.Request, _: StockAdmin) -> tuple[Any, dict[str, Any]]:
    """POST /admin/orders/{request_id}/cancel: an admin's cancel."""
    order = await _cancel(request, Cause.ADMIN)
    return order, {"request_id": order["request_id"], "status": order["status"]}


@admin_change
async def admin_refund(request: web.Request, _: StockAdmin) -> tuple[Any, dict[str, Any]]:
    """POST /admin/orders/{request_id}/refund: an admin's refund."""
    order = await _refund(request, Cause.ADMIN)
    return order, {"request_id": order["request_id"], "status": order["status"]}


async def _cancel(request: web.Request, cause: Cause) -> dict[str, Any]:
    request_id = payloads.identifier(request.match_info["request_id"], "request_id")
    data = payloads.parse_object(await read_body(request) or b"{}", CANCEL_FIELDS)
    reason = payloads.display_text(data.get("reason"), "reason", REASON_MAX)
    order = await request.app[LIFECYCLE].cancel(request_id, reason=reason, cause=cause)
    return order.as_json()


async def _refund(request: web.Request, cause: Cause) -> dict[str, Any]:
    request_id = payloads.identifier(request.match_info["request_id"], "request_id")
    data = payloads.parse_object(await read_body(request), REFUND_FIELDS)
    restock = data.get("restock")
    if not isinstance(restock, bool):
        raise InvalidRequest("restock is required: true (the units go back on sale) or false")
    reason = payloads.display_text(data.get("reason"), "reason", REASON_MAX)
    closed = await request.app[LIFECYCLE].refund(
        request_id, restock=restock, reason=reason, cause=cause
    )
    return {**closed.order.as_json(), "payment_id": closed.payment_id}


async def late_payments(request: web.Request) -> web.Response:
    """GET /v1/late-payments?status=owed|refunded|all&after=CURSOR&limit=N: the
    payments refused after their order closed, oldest first, and ``next``."""
    _check_payer(request)
    return await _late_page(request)


async def admin_late_payments(request: web.Request) -> web.Response:
    """GET /admin/late-payments: the same list, for an admin."""
    check_admin(request)
    return await _late_page(request)


async def _late_page(request: web.Request) -> web.Response:
    query = request.query
    raw = query.get("status", LateStatus.ALL)
    try:
        status = LateStatus(raw)
    except ValueError:
        raise InvalidRequest("status must be one of owed, refunded, all") from None
    after = query_int(query, "after", low=0, high=SEQ_MAX, default=0)
    page = await request.app[LIFECYCLE].late_payments(status, after, _limit(query))
    return json_response({"late_payments": [p.as_json() for p in page.items], "next": page.next})


async def refund_late(request: web.Request) -> web.Response:
    """POST /v1/late-payments/{payment_id}/refund: 200 refunded, idempotent."""
    _check_payer(request)
    payment_id = payloads.identifier(request.match_info["payment_id"], "payment_id")
    late = await request.app[LIFECYCLE].refund_late(payment_id)
    shown = late.as_json()
    return json_response({k: shown[k] for k in ("payment_id", "order_id", "status", "refunded_at")})


async def buyer_orders(request: web.Request) -> web.Response:
    """GET /v1/orders?user_id=U[&sku=&status=&after=&limit=]: a buyer's orders,
    newest first, and ``next``."""
    _check_payer(request)
    query = request.query
    if "user_id" not in query:
        raise InvalidRequest("user_id is required")
    user_id = payloads.identifier(query["user_id"], "user_id")
    sku = query.get("sku")
    if sku is not None:
        payloads.identifier(sku, "sku")
    status = None
    if "status" in query:
        try:
            status = OrderStatus(query["status"])
        except ValueError:
            shown = ", ".join(s.value for s in OrderStatus)
            raise InvalidRequest(f"status must be one of {shown}") from None
    before = None
    if "after" in query:
        try:
            before = OrderCursor.parse(query["after"])
        except ValueError as exc:
            raise InvalidRequest(f"after {exc}") from None
    page = await request.app[LIFECYCLE].buyer_orders(
        user_id, sku=sku, status=status, before=before, limit=_limit(query)
    )
    return json_response({"orders": [o.as_json() for o in page.items], "next": page.next})


def _limit(query: Mapping[str, str]) -> int:
    return query_int(query, "limit", low=1, high=PAGE_MAX, default=PAGE_DEFAULT)


def routes() -> list[web.RouteDef]:
    """The payment service's routes, and the admin's list of late payments."""
    return [
        web.post("/v1/orders/{request_id}/pay", pay),
        web.post("/v1/orders/{request_id}/cancel", cancel),
        web.post("/v1/orders/{request_id}/refund", refund),
        web.get("/v1/orders", buyer_orders),
        web.get("/v1/late-payments", late_payments),
        web.post("/v1/late-payments/{payment_id}/refund", refund_late),
        web.get("/admin/late-payments", admin_late_payments),
        web.post("/admin/orders/{request_id}/cancel", admin_cancel),
        web.post("/admin/orders/{request_id}/refund", admin_refund),
    ]
