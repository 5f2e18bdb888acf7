"""What the stock scripts and the stock reads speak, as values: a reservation's
:class:`Reply` and its outcome, a flush's :class:`Settlement`, a ledger entry
(:class:`Pending`), a counter's :class:`StockLoad` mode. No I/O here: the Redis
adapter (``gateway.redis.reservations``) makes and takes them, the use cases
decide on them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, NamedTuple

from gateway.domain.errors import (
    Ended,
    GroupLimitReached,
    IdempotencyMismatch,
    NotStarted,
    RateLimited,
    Unavailable,
)
from gateway.domain.model import (
    DUPLICATE,
    IN_PROGRESS,
    SOLD_OUT,
    Order,
    Outcome,
    Purchase,
    Result,
    SkuInfo,
    Verdict,
)

ReplyKind = Literal[
    "ok",
    "confirmed",
    "mismatch",
    "in_progress",
    "missing",
    "unverified",
    "duplicate",
    "sold_out",
    "not_started",
    "ended",
    "rate_limited",
    "busy",
    "group_limit",
]


@dataclass(frozen=True, slots=True)
class Reply:
    """What reserve.lua answered for one purchase."""

    kind: ReplyKind
    order: Order | None = None
    # "sold_out", "unverified": stock is 0 and nothing is pending.
    exhausted: bool = False
    # "ok": when Redis reserved it, by Redis's clock (the ledger's stamp).
    reserved_at_ms: int = 0
    # "not_started", "rate_limited": how long until trying again makes sense.
    wait_ms: int = 0
    # "unverified": nobody holds the sku's rebuild lease (its holder died).
    orphaned: bool = False


_OUTCOMES = {"sold_out": SOLD_OUT, "duplicate": DUPLICATE, "in_progress": IN_PROGRESS}


def outcome_of(reply: Reply, request_id: str, info: SkuInfo) -> Result:
    """The outcome of a reservation that did not reserve; raises the
    :class:`GatewayError` of a refusal (mismatch, rate limit, window, 503)."""
    if reply.kind == "confirmed":
        return Result(Outcome.CONFIRMED, reply.order)
    if reply.kind == "mismatch":
        raise IdempotencyMismatch(request_id)
    if reply.kind == "rate_limited":
        raise RateLimited(reply.wait_ms)
    if reply.kind == "not_started":
        starts_at = info.rules.window_json()["starts_at"]
        raise NotStarted(starts_at or "", reply.wait_ms)
    if reply.kind == "ended":
        raise Ended()
    if reply.kind == "group_limit" and info.group is not None:
        raise GroupLimitReached(info.group.name)
    result = _OUTCOMES.get(reply.kind)
    if result is None:
        raise Unavailable("stock not loaded")
    return result


def replayed(order: Order, purchase: Purchase) -> Result:
    """The answer to a purchase whose request id made ``order``; raises
    IdempotencyMismatch when it names another sku, buyer or qty."""
    if (order.sku, order.user_id, order.qty) != (purchase.sku, purchase.user_id, purchase.qty):
        raise IdempotencyMismatch(purchase.request_id)
    return Result(Outcome.CONFIRMED, order.as_first_answered())


@dataclass(frozen=True, slots=True)
class Settlement:
    """One reservation's verdict, as settle.lua takes it."""

    request_id: str
    verdict: Verdict
    user_id: str
    qty: int
    order_id: str = ""


@dataclass(frozen=True, slots=True)
class Pending:
    """One entry of the pending ledger: a reservation not yet settled."""

    request_id: str
    user_id: str
    qty: int
    reserved_at_ms: int


class Snapshot(NamedTuple):
    """A sku's counter and ledger, read together (snapshot.lua)."""

    # None when the counter is missing.
    stock: int | None
    pending: list[Pending]


class StockLoad(StrEnum):
    """How load_stock.lua sets a sku's counter from the database's stock."""

    # Only a missing counter (Redis lost it, or it expired); setting one flags
    # the sku as rebuilding.
    RELOAD = "reload"
    # Always (an admin changed the database stock); a counter that was missing
    # flags the sku as rebuilding.
    RESET = "reset"
    # A reset whose caller knows the buyers and done hashes are whole (a sku
    # created now, or a tool that wrote them): never flags the sku.
    FRESH = "fresh"
    # A reset because the counter disagreed with the database (Redis lost
    # writes): flags the sku as rebuilding, unless a rebuild is under way.
    REPAIR = "repair"


# A new purchase's replay or repeat buyer, while its sku is rebuilt: the order
# its request id made (of any sku), if any, and whether its buyer bought the sku.
Prior = tuple[Order | None, bool]


@dataclass(frozen=True, slots=True)
class OrderPage:
    """One page of a sku's orders in buyer order: the fields asked for, flat;
    the page's last buyer (where the next page starts) and its count of orders."""

    fields: list[str]
    last_user: str
    count: int
