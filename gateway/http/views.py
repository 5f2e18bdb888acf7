"""HTTP handlers: thin, parse and answer; the use cases do the work."""

from __future__ import annotations

from typing import Any

import orjson
import structlog
from aiohttp import web

from gateway.domain.errors import (
    ClientGone,
    InvalidRequest,
    NotFound,
    TooLarge,
    UndecodableBody,
)
from gateway.domain.model import Outcome, Result
from gateway.domain.rules import rfc3339
from gateway.http import payloads
from gateway.http.appkeys import (
    ADMISSIONS,
    BATCHER,
    CATALOG,
    LANES,
    METRICS,
    ORDERS,
    PURCHASES,
    RESERVATIONS,
    SERVABILITY,
    STOPPING,
    TRACKER,
    WAITING_PAGE,
)
from gateway.http.clients import current_client
from gateway.http.middlewares import OUTCOME
from gateway.http.params import header, query_decimal
from gateway.http.prebuilt import DirectAnswers, Written
from gateway.ops.metrics import CONTENT_TYPE
from gateway.usecases.admission import Admissions, Place
from gateway.usecases.purchases import Purchases
from gateway.usecases.tracking import MAX_WAIT_S

log = structlog.get_logger(__name__)

JSON = "application/json"
# The bodies of the answers that carry nothing but their outcome.
_SOLD_OUT_BODY = orjson.dumps({"status": Outcome.SOLD_OUT})
_DUPLICATE_BODY = orjson.dumps({"status": Outcome.DUPLICATE})
_IN_PROGRESS_BODY = orjson.dumps({"status": "in_progress"})
_RETRY_AFTER = {"Retry-After": "1"}
# Purchase answers written straight to the socket where that sends the same
# bytes (see gateway.http.prebuilt); one Written response per outcome serves them all.
DIRECT = DirectAnswers()
_WRITTEN = {
    outcome: Written(status, outcome.value)
    for outcome, status in (
        (Outcome.CONFIRMED, 201),
        (Outcome.ACCEPTED, 202),
        (Outcome.SOLD_OUT, 409),
        (Outcome.DUPLICATE, 409),
    )
}
_CONSTANT = {Outcome.SOLD_OUT: _SOLD_OUT_BODY, Outcome.DUPLICATE: _DUPLICATE_BODY}


def json_response(
    data: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON response rendered by orjson."""
    return web.Response(body=orjson.dumps(data), status=status, content_type=JSON, headers=headers)


async def read_body(request: web.Request) -> bytes:
    """The body, refusing more than :data:`payloads.MAX_BODY` before reading it
    when the length is declared. Raises :class:`ClientGone` when the client
    went away first, :class:`UndecodableBody` when the body's bytes do not
    decode as its Content-Encoding (or chunked framing) says."""
    if (request.content_length or 0) > payloads.MAX_BODY:
        raise TooLarge(f"body over {payloads.MAX_BODY} bytes")
    try:
        return await request.read()
    except web.RequestPayloadError:
        # The client's bytes, not a fault of ours. The body is ended here: with
        # its error left in place, aiohttp's read of what remains after the
        # answer raises it again, and logs it as unhandled.
        request.content.feed_eof()
        raise UndecodableBody(
            "the body does not decode as its Content-Encoding or chunked framing says"
        ) from None
    except TimeoutError:
        # Set by the read deadline (gateway.http.limits): the client stalled.
        raise ClientGone("the body did not arrive in time") from None
    except OSError as exc:
        # aiohttp's ConnectionResetError("Connection lost"), or the socket's own
        # error: the client's, and told apart here, where it cannot be a
        # dependency's (an OSError past this point is a driver's: a 503).
        raise ClientGone("the connection was lost before the body arrived") from exc


def purchase_response(result: Result) -> web.Response:
    """The HTTP answer of a purchase outcome, tagged with it for the metrics."""
    status, body, headers = _rendered(result)
    resp = web.Response(body=body, status=status, content_type=JSON, headers=headers)
    resp[OUTCOME] = result.outcome.value
    return resp


def _rendered(result: Result) -> tuple[int, bytes, dict[str, str] | None]:
    """Status, JSON body and extra headers of a purchase outcome."""
    outcome = result.outcome
    if outcome is Outcome.CONFIRMED and result.order is not None:
        return 201, orjson.dumps(result.order.as_json()), None
    if outcome is Outcome.ACCEPTED:
        return 202, orjson.dumps({"status": "accepted", "request_id": result.request_id}), None
    if result.held:
        body = orjson.dumps({"status": Outcome.SOLD_OUT, "held": result.held})
        return 409, body, {"Retry-After": str(result.retry_after_s)}
    constant = _CONSTANT.get(outcome)
    if constant is not None:
        return 409, constant, None
    return 409, _IN_PROGRESS_BODY, _RETRY_AFTER


def purchase_answer(request: web.Request, result: Result) -> web.StreamResponse:
    """The purchase's answer, written directly where that sends the same bytes."""
    written = _WRITTEN.get(result.outcome)
    if written is None or not DIRECT.fits(request):
        return purchase_response(result)
    constant = _CONSTANT.get(result.outcome)
    if constant is not None and not result.held:
        return DIRECT.send_constant(request, written.status, constant, written)
    status, body, headers = _rendered(result)
    if headers is not None or status != written.status:  # not the answer it stands for
        return purchase_response(result)
    return DIRECT.send(request, status, body, written)


async def purchase(request: web.Request) -> web.StreamResponse:
    """POST /v1/purchase, through the router (see gateway.http.fastpath for the other way in)."""
    app = request.app
    return await buy(request, admissions=app[ADMISSIONS], purchases=app[PURCHASES])


async def buy(
    request: web.Request, *, admissions: Admissions, purchases: Purchases
) -> web.StreamResponse:
    """POST /v1/purchase, given the use cases: the fast path calls it bound
    to them, since a request it serves has no matched route (and so no
    ``request.app``)."""
    body = await read_body(request)
    headers = request.headers
    p = payloads.purchase(body, header(headers, "Idempotency-Key"))
    # Checked whatever the sku does with it (tests/e2e/test_contract.py).
    token = payloads.admission_token(header(headers, "Admission-Token"))
    if admissions.open_door(p.sku):
        # The client address is worked out only if a client rate limit applies:
        # nothing is parsed or allocated for it on the sold-out path.
        result = await purchases.purchase(p, current_client)
    else:
        result = await admissions.purchase(p, token, current_client)
    if result.outcome is Outcome.CONFIRMED:
        purchases.answered_confirmed(p.sku)
    return purchase_answer(request, result)


async def get_order(request: web.Request) -> web.Response:
    """GET /v1/orders/{request_id}?user_id=U: where U's purchase under the request
    id stands. Without a user_id, or with another buyer's, the answer is the
    unknown request id's 404, byte for byte: only the buyer learns anything."""
    request_id = payloads.identifier(request.match_info["request_id"], "request_id")
    buyer = request.query.get("user_id")
    wait_s = query_decimal(request.query, "wait", high=MAX_WAIT_S, default=0.0)
    result = None
    if buyer is not None:
        user_id = payloads.identifier(buyer, "user_id")
        result = await request.app[TRACKER].status(request_id, user_id, wait_s)
    if result is None:
        raise NotFound(f"no order for request {request_id!r}")
    return order_response(result)


def order_response(result: Result) -> web.Response:
    """The lookup's answer of a known outcome: 200 with the order once confirmed,
    else the purchase's own answer (202 queued, 409 refused)."""
    if result.outcome is Outcome.CONFIRMED and result.order is not None:
        return json_response(result.order.as_json())
    return purchase_response(result)


async def get_sku(request: web.Request) -> web.Response:
    """GET /v1/skus/{sku}: what is left to buy, the strategy it sells under, its
    window, whether it has a waiting room, and its display fields."""
    sku = payloads.identifier(request.match_info["sku"], "sku")
    available = await request.app[PURCHASES].available(sku)
    catalog = request.app[CATALOG]
    info = await catalog.get(sku)
    strategy, rules = catalog.strategy_of(info), info.rules
    body = {"sku": sku, "available": available, "strategy": strategy.value, **rules.window_json()}
    body["waiting_room"] = await request.app[ADMISSIONS].has_room(sku)
    body.update(info.display.as_json())
    group = info.group
    if group is not None:
        body["limit_group"] = group.name
        body["group_per_user_limit"] = group.per_user_limit
    return json_response(body)


async def waiting_page(request: web.Request) -> web.Response:
    """GET /wait/{sku}?user_id=U[&return_to=URL][&pay_to=URL][&lang=L]: the waiting-room page."""
    return request.app[WAITING_PAGE].answer(request)


async def join_room(request: web.Request) -> web.Response:
    """POST /v1/queue/{sku}: a ticket in the sku's waiting room (the same one again
    for a user who joined before), or 409 sold_out; in a room that checks for
    bots a new ticket needs a ``bot_token`` that passes (else 403, or 503)."""
    sku = payloads.identifier(request.match_info["sku"], "sku")
    data = payloads.parse_object(await read_body(request), payloads.JOIN_FIELDS)
    if "user_id" not in data:
        raise InvalidRequest("user_id is required")
    user_id = payloads.identifier(data["user_id"], "user_id")
    bot_token = payloads.bot_token(data)
    joined = await request.app[ADMISSIONS].join(sku, user_id, bot_token, current_client)
    if joined is None:
        return web.Response(body=_SOLD_OUT_BODY, status=409, content_type=JSON)
    return json_response({"ticket": joined.ticket, **_place(joined.place)})


async def poll_room(request: web.Request) -> web.Response:
    """GET /v1/queue/{sku}/{ticket}: waiting, admitted (with a token), or sold out."""
    sku = payloads.identifier(request.match_info["sku"], "sku")
    ticket = payloads.identifier(request.match_info["ticket"], "ticket")
    standing = await request.app[ADMISSIONS].poll(sku, ticket)
    if standing is None:
        return web.Response(body=_SOLD_OUT_BODY, content_type=JSON)
    if isinstance(standing, Place):
        return json_response({"status": "waiting", **_place(standing)})
    return json_response(
        {
            "status": "admitted",
            "admission_token": standing.token,
            "expires_at": rfc3339(standing.expires_at),
            "user_id": standing.user_id,
        }
    )


def _place(place: Place) -> dict[str, int]:
    return {"position": place.position, "eta_s": place.eta_s, "poll_after_s": place.poll_after_s}


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz: the process answers."""
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """GET /readyz: 200 while Redis and PostgreSQL answer and no stop has begun
    (``draining`` covers the lame duck too: purchases are still served then),
    once a worker has linked to the host's other workers (``lanes``: a worker
    still starting would have its skus' purchases flushed elsewhere).
    ``unservable`` names the configured skus this instance cannot serve, and
    why; they do not make it unready (see gateway.usecases.servable)."""
    app = request.app
    redis_ok = await app[RESERVATIONS].ping()
    db_ok = await app[ORDERS].ping()
    unservable = await app[SERVABILITY].unservable() if db_ok else {}
    draining = app[STOPPING].is_set() or app[BATCHER].closing
    lanes = app[LANES]
    linked = lanes is None or lanes.linked
    ready = redis_ok and db_ok and linked and not draining
    body: dict[str, Any] = {"ready": ready, "redis": redis_ok, "postgres": db_ok}
    body.update(draining=draining, lanes=linked, unservable=unservable)
    return json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text exposition."""
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


# The query parameters each route takes (by its path); the others take none.
QUERIES = {
    "/v1/orders/{request_id}": frozenset({"user_id", "wait"}),
    "/wait/{sku}": frozenset({"user_id", "return_to", "pay_to", "lang", "bot_token"}),
}


def routes(*, with_metrics: bool) -> list[web.RouteDef]:
    """Every route of the API."""
    return [
        web.post("/v1/purchase", purchase),
        web.get("/v1/orders/{request_id}", get_order),
        web.get("/v1/skus/{sku}", get_sku),
        web.post("/v1/queue/{sku}", join_room),
        web.get("/v1/queue/{sku}/{ticket}", poll_room),
        web.get("/wait/{sku}", waiting_page),
        web.get("/healthz", healthz),
        web.get("/readyz", readyz),
        *([web.get("/metrics", metrics)] if with_metrics else []),
    ]
