"""HTTP handlers of an order's payment and cancel, for the shop's payment
service: ``POST /v1/orders/{request_id}/pay`` and ``/cancel``, authorised by
``Authorization: Bearer <GATEWAY_PAYMENT_TOKEN>`` (not the admin token), and
the late payments an admin refunds (``GET /admin/late-payments``)."""

from __future__ import annotations

import hmac

from aiohttp import web

from gateway.domain.errors import InvalidRequest, PaymentUnauthorized
from gateway.http import payloads
from gateway.http.admin_views import check_admin
from gateway.http.appkeys import LIFECYCLE, SETTINGS
from gateway.http.params import header, query_int
from gateway.http.views import json_response, read_body

PAY_FIELDS = frozenset({"payment_id"})
# Late payments listed per page at most.
PAGE_MAX = 1000
PAGE_DEFAULT = 100


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
    """POST /v1/orders/{request_id}/cancel: 200 cancelled, its units back on sale."""
    _check_payer(request)
    request_id = payloads.identifier(request.match_info["request_id"], "request_id")
    payloads.parse_object(await read_body(request) or b"{}", frozenset())
    order = await request.app[LIFECYCLE].cancel(request_id)
    return json_response(order.as_json())


async def late_payments(request: web.Request) -> web.Response:
    """GET /admin/late-payments[?after=PAYMENT_ID&limit=N]: payments refused
    after their order expired or was cancelled, to refund, by payment id."""
    check_admin(request)
    after = request.query.get("after")
    if after is not None:
        payloads.identifier(after, "after")
    limit = query_int(request.query, "limit", low=1, high=PAGE_MAX, default=PAGE_DEFAULT)
    page = await request.app[LIFECYCLE].late_payments(after or "", limit)
    return json_response({"late_payments": page})


def routes() -> list[web.RouteDef]:
    """The payment service's routes, and the admin's list of late payments."""
    return [
        web.post("/v1/orders/{request_id}/pay", pay),
        web.post("/v1/orders/{request_id}/cancel", cancel),
        web.get("/admin/late-payments", late_payments),
    ]
