"""The gateway's errors: one hierarchy, each with its HTTP status and code.

Adapters turn driver errors into these; one middleware turns these into JSON
responses. Purchase outcomes such as ``sold_out`` are not errors: they are
:class:`gateway.domain.model.Outcome` values.
"""

from __future__ import annotations

from collections.abc import Mapping


class GatewayError(Exception):
    """Base of every error the gateway answers with a 4xx or 5xx.

    An instance keeps each argument of its class's constructor as the attribute
    of the same name: a worker rebuilds the error another raised from them
    (gateway.write.frames)."""

    status: int = 500
    code: str = "internal"
    # Close the connection after answering, so the client reconnects elsewhere.
    close_connection: bool = False

    def __init__(self, detail: str | None = None, headers: Mapping[str, str] | None = None):
        super().__init__(detail or self.code)
        self.detail = detail
        self.headers = dict(headers or {})

    def body(self) -> dict[str, str]:
        """The JSON body of the answer."""
        body = {"error": self.code}
        if self.detail is not None and self.detail != self.code:
            body["detail"] = self.detail
        return body


class InvalidRequest(GatewayError):
    """The request body or parameters are malformed."""

    status = 400
    code = "invalid_request"


class Unauthorized(GatewayError):
    """The admin bearer token is missing or wrong."""

    status = 401
    code = "unauthorized"


class Forbidden(GatewayError):
    """Admin routes are switched off (no admin token configured)."""

    status = 403
    code = "forbidden"


class NotFound(GatewayError):
    """No such route or record."""

    status = 404
    code = "not_found"


class UnknownSku(NotFound):
    """The sku does not exist in the inventory."""

    code = "unknown_sku"


class UndecodableBody(InvalidRequest):
    """The body's bytes do not decode as its Content-Encoding (or its chunked
    framing) says: what is left of the request cannot be told from the next
    one, so the connection is closed after the answer."""

    close_connection = True


class DuplicateKey(InvalidRequest):
    """A JSON object of the body names one field twice: which value is meant is
    not for the gateway to guess."""

    code = "duplicate_key"


class ClientGone(GatewayError):
    """The client went away before its request's body arrived: it closed or reset
    the connection, or sent nothing more within ``GATEWAY_REQUEST_READ_TIMEOUT_S``.
    Answered 408 when anyone is left to read it, and counted as the purchase
    outcome ``client_gone``, never as a dependency's failure."""

    status = 408
    code = "request_timeout"
    close_connection = True


class IdempotencyMismatch(GatewayError):
    """The request id was first used for another purchase (sku, user or qty).

    As draft-ietf-httpapi-idempotency-key-header asks: never the other
    purchase's outcome, and nothing changes."""

    status = 422
    code = "idempotency_mismatch"

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"request id {request_id!r} was first used for another purchase "
            "(sku, user_id or qty); use a new request id for a new purchase"
        )
        self.request_id = request_id


class NotConfigured(GatewayError):
    """A sku configuration this instance could not serve: a setting it needs is
    missing (see gateway.usecases.servable). Refused when configured, not when used."""

    status = 422
    code = "not_configured"


class ImageOriginRefused(GatewayError):
    """A sku's ``image_url`` is on an origin the operator did not list
    (``GATEWAY_WAITING_PAGE_IMAGE_ORIGINS``): the waiting page's policy would
    block it. Refused when set, not when shown."""

    status = 422
    code = "image_origin_not_allowed"


class MethodNotAllowed(GatewayError):
    """The route exists but not with this method."""

    status = 405
    code = "method_not_allowed"


class ExpectationFailed(GatewayError):
    """An ``Expect`` header other than ``100-continue``, the one expectation
    HTTP/1.1 defines."""

    status = 417
    code = "expectation_failed"


class TooLarge(GatewayError):
    """The request body is over the size limit."""

    status = 413
    code = "too_large"


class Unavailable(GatewayError):
    """Redis or PostgreSQL could not confirm; whatever was reserved was given back."""

    status = 503
    code = "unavailable"
    # Why, as the flush-failure metric and log label it.
    reason: str = "unavailable"

    def __init__(self, detail: str | None = None, retry_after: int = 1):
        super().__init__(detail, {"Retry-After": str(retry_after)})
        self.retry_after = retry_after


class ShuttingDown(Unavailable):
    """This instance is draining: try another one."""

    close_connection = True

    def __init__(self) -> None:
        super().__init__("shutting down")


class RedisUnavailable(Unavailable):
    """Redis could not be reached or refused the command."""

    reason = "redis"


class PostgresUnavailable(Unavailable):
    """PostgreSQL could not be reached or refused the statement."""

    reason = "postgres"


class OutcomeUnknown(PostgresUnavailable):
    """The connection broke after the flush was sent: it may or may not have
    committed. Its reservations stay in the ledger for the reconciler, which
    settles each from the order rows; giving them back now could sell a unit
    twice in Redis and tell a buyer who got the order that it was sold out."""


class FencedOut(Unavailable):
    """The flush's fencing token is older than the row's: its lock expired and
    another holder wrote since. Nothing was written; the flush is retried under
    a fresh acquisition."""

    reason = "fenced_out"


class StockGuardRefused(PostgresUnavailable):
    """The guarded UPDATE found less stock than the batch was granted: nothing
    was written. The row lock makes this unreachable unless something writes the
    row without it; the guard is the floor that holds all the same."""

    reason = "stock_guard"


class GroupGuardRefused(PostgresUnavailable):
    """The insert of a batch's orders would have taken a buyer past their limit
    group's ``per_user_limit`` (SQLSTATE FS003, ``sql/020_limit_groups.sql``):
    nothing was written. The flush locks its buyers' holdings and refuses them
    first (verdict ``L``), so this is the floor that holds all the same."""

    reason = "group_guard"


class GroupLimitReached(GatewayError):
    """The buyer already holds their limit group's ``per_user_limit`` units
    across the group's skus (reserved, queued, in a batch, or in live orders)."""

    status = 409
    code = "group_limit_reached"

    def __init__(self, limit_group: str) -> None:
        super().__init__(f"the buyer holds the limit of group {limit_group!r}")
        self.limit_group = limit_group

    def body(self) -> dict[str, str]:
        """``{"status": "group_limit_reached", "limit_group": ...}``: an answer, not a fault."""
        return {"status": self.code, "limit_group": self.limit_group}


class UnknownLimitGroup(GatewayError):
    """A sku names a limit group that does not exist."""

    status = 422
    code = "unknown_limit_group"


class NoLimitGroup(NotFound):
    """``/admin/limit-groups/{group}`` names no group."""

    code = "unknown_limit_group"


class GroupInUse(GatewayError):
    """A limit group still named by a sku cannot be deleted."""

    status = 409
    code = "group_in_use"


class LimitGroupLocked(GatewayError):
    """A sku's limit group changes only while nothing of it is held: no live
    order, no reservation pending (its Redis state moves to the new group's slot)."""

    status = 409
    code = "limit_group_locked"


class AdmissionRequired(GatewayError):
    """A waiting-room sku was bought without an ``Admission-Token`` header."""

    status = 428
    code = "admission_required"


class AdmissionInvalid(GatewayError):
    """The admission token is forged, expired, for another user or sku, or spent."""

    status = 403
    code = "admission_invalid"


class BotCheckFailed(GatewayError):
    """A join of a room with a bot check brought no bot token, or one the
    provider did not vouch for, or one already used."""

    status = 403
    code = "bot_check_failed"


class BotCheckUnavailable(Unavailable):
    """The bot check's provider did not answer within its time, or answered
    with an error: the join is refused (failing closed), and may be retried."""

    code = "bot_check_unavailable"
    reason = "bot_check"


class UnknownTicket(NotFound):
    """No such ticket in the sku's waiting room."""

    code = "unknown_ticket"


class NoWaitingRoom(NotFound):
    """The sku exists but has no waiting room."""

    code = "no_waiting_room"


class Contended(Unavailable):
    """An optimistic purchase lost the race for its sku's row on every attempt of
    its budget. Nothing was written; the client may retry with the same request id."""

    reason = "contended"


# The longest Retry-After sent: a day. A sale that far off is not worth a
# client's timer, and a far-future start (2099) would otherwise say 2e9 seconds.
MAX_RETRY_AFTER_S = 86_400


def _seconds(ms: int) -> str:
    """A Retry-After value: whole seconds, rounded up, at least one, at most
    :data:`MAX_RETRY_AFTER_S`."""
    return str(min(MAX_RETRY_AFTER_S, max(1, -(-ms // 1000))))


class NotStarted(GatewayError):
    """The sku's sale window has not opened yet (by Redis's clock)."""

    status = 409
    code = "not_started"

    def __init__(self, starts_at: str, ms_to_start: int) -> None:
        super().__init__(f"the sale starts at {starts_at}", {"Retry-After": _seconds(ms_to_start)})
        self.starts_at = starts_at
        self.ms_to_start = ms_to_start

    def body(self) -> dict[str, str]:
        """``{"status": "not_started", "starts_at": ...}``: an answer, not a fault."""
        return {"status": self.code, "starts_at": self.starts_at}


class Ended(GatewayError):
    """The sku's sale window has closed (by Redis's clock)."""

    status = 409
    code = "ended"

    def body(self) -> dict[str, str]:
        """``{"status": "ended"}``."""
        return {"status": self.code}


class RateLimited(GatewayError):
    """The user's or the client's token bucket for this sku is empty."""

    status = 429
    code = "rate_limited"

    def __init__(self, ms_to_a_token: int) -> None:
        super().__init__(None, {"Retry-After": _seconds(ms_to_a_token)})
        self.ms_to_a_token = ms_to_a_token


class PaymentUnauthorized(Unauthorized):
    """The payment service's bearer token (GATEWAY_PAYMENT_TOKEN) is missing or wrong."""


class AlreadyPaid(GatewayError):
    """The order was paid with another payment id."""

    status = 409
    code = "already_paid"


class OrderPaid(GatewayError):
    """A cancel of an order already paid."""

    status = 409
    code = "order_paid"


class OrderExpired(GatewayError):
    """The order was not paid by its pay_by: its units went back on sale."""

    status = 409
    code = "order_expired"


class OrderCancelled(GatewayError):
    """The order was cancelled: its units went back on sale."""

    status = 409
    code = "order_cancelled"


class OrderRefunded(GatewayError):
    """The order was refunded: it takes no payment, nor a cancel."""

    status = 409
    code = "order_refunded"


class OrderNotPaid(GatewayError):
    """A refund of an order that is not paid (pending, cancelled, expired)."""

    status = 409
    code = "order_not_paid"


class NoPaymentWindow(GatewayError):
    """The order's sku had no payment window: it was final at its 201."""

    status = 409
    code = "no_payment_window"


class PaymentIdTaken(GatewayError):
    """The payment id already paid another order."""

    status = 409
    code = "payment_id_taken"
