"""What the stock scripts and the stock reads speak, as values: a reservation's
:class:`Reply` and its outcome, a flush's :class:`Settlement`, a ledger entry
(:class:`Pending`), a counter's :class:`StockLoad` mode. No I/O here: the Redis
adapter (``gateway.redis.reservations``) makes and takes them, the use cases
decide on them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

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


class ReplyKind(StrEnum):
    """What reserve.lua (or the queue strategy's script) decided for one
    purchase: its answer's first element, as the script spells it.

    A hot module compares a reply's kind by identity with members bound to its
    own module-level names (``OK = ReplyKind.OK``): on CPython 3.11 a global is
    several times cheaper to read than an Enum class's attribute."""

    OK = "ok"  # reserved (and in the stream, for the queue strategy)
    CONFIRMED = "confirmed"  # a replay: the request id's order
    MISMATCH = "mismatch"  # the request id made another purchase
    IN_PROGRESS = "in_progress"  # the request id is reserved and not yet flushed
    MISSING = "missing"  # no counter: Redis lost it, or it expired
    UNVERIFIED = "unverified"  # the sku's hashes are being rebuilt
    DUPLICATE = "duplicate"  # the buyer holds another request id's reservation or order
    SOLD_OUT = "sold_out"
    NOT_STARTED = "not_started"
    ENDED = "ended"
    RATE_LIMITED = "rate_limited"
    BUSY = "busy"  # the queue strategy's stream is full
    GROUP_LIMIT = "group_limit"  # the buyer's limit group is spent


# The script's raw kind to its member: one dict lookup, no Enum call.
REPLY_KINDS: dict[str, ReplyKind] = {kind.value: kind for kind in ReplyKind}

_CONFIRMED = ReplyKind.CONFIRMED
_MISMATCH = ReplyKind.MISMATCH
_RATE_LIMITED = ReplyKind.RATE_LIMITED
_NOT_STARTED = ReplyKind.NOT_STARTED
_ENDED = ReplyKind.ENDED
_GROUP_LIMIT = ReplyKind.GROUP_LIMIT


@dataclass(frozen=True, slots=True)
class Reply:
    """What reserve.lua answered for one purchase."""

    kind: ReplyKind
    order: Order | None = None
    # SOLD_OUT, UNVERIFIED: stock is 0 and nothing is pending.
    exhausted: bool = False
    # OK: when Redis reserved it, by Redis's clock (the ledger's stamp).
    reserved_at_ms: int = 0
    # NOT_STARTED, RATE_LIMITED: how long until trying again makes sense.
    wait_ms: int = 0
    # UNVERIFIED: nobody holds the sku's rebuild lease (its holder died).
    orphaned: bool = False


_OUTCOMES = {
    ReplyKind.SOLD_OUT: SOLD_OUT,
    ReplyKind.DUPLICATE: DUPLICATE,
    ReplyKind.IN_PROGRESS: IN_PROGRESS,
}


def outcome_of(reply: Reply, request_id: str, info: SkuInfo) -> Result:
    """The outcome of a reservation that did not reserve; raises the
    :class:`GatewayError` of a refusal (mismatch, rate limit, window, 503)."""
    kind = reply.kind
    if kind is _CONFIRMED:
        return Result(Outcome.CONFIRMED, reply.order)
    if kind is _MISMATCH:
        raise IdempotencyMismatch(request_id)
    if kind is _RATE_LIMITED:
        raise RateLimited(reply.wait_ms)
    if kind is _NOT_STARTED:
        starts_at = info.rules.window_json()["starts_at"]
        raise NotStarted(starts_at or "", reply.wait_ms)
    if kind is _ENDED:
        raise Ended()
    if kind is _GROUP_LIMIT and info.group is not None:
        raise GroupLimitReached(info.group.name)
    result = _OUTCOMES.get(kind)
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
