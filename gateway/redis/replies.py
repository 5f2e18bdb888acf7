"""What the stock scripts answer and take, as values (``gateway.redis.inventory`` calls
the scripts): reserve.lua's :class:`Reply` and its decoding, settle.lua's
:class:`Settlement`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.domain.errors import Ended, IdempotencyMismatch, NotStarted, RateLimited, Unavailable
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
]


@dataclass(frozen=True, slots=True)
class Reply:
    """What reserve.lua answered for one purchase."""

    kind: ReplyKind
    order: Order | None = None
    # "sold_out", "unverified": stock is 0 and nothing is pending.
    settled: bool = False
    # "ok": when Redis reserved it, by Redis's clock (the ledger's stamp).
    reserved_at_ms: int = 0
    # "not_started", "rate_limited": how long until trying again makes sense.
    wait_ms: int = 0
    # "unverified": nobody holds the sku's rebuild lease (its holder died).
    orphaned: bool = False


@dataclass(frozen=True, slots=True)
class Settlement:
    """One reservation's verdict, as settle.lua takes it."""

    request_id: str
    verdict: Verdict
    user_id: str
    qty: int
    order_id: str = ""


_SIMPLE_KINDS: tuple[ReplyKind, ...] = (
    "mismatch",
    "in_progress",
    "missing",
    "duplicate",
    "ended",
    "busy",
)
_SIMPLE: dict[str, Reply] = {kind: Reply(kind) for kind in _SIMPLE_KINDS}
_SOLD_OUT = Reply("sold_out")
_SOLD_OUT_SETTLED = Reply("sold_out", settled=True)
# "unverified", by (orphaned, settled).
_UNVERIFIED = {
    (orphaned, settled): Reply("unverified", settled=settled, orphaned=orphaned)
    for orphaned in (False, True)
    for settled in (False, True)
}


def reply_of(raw: Any, purchase: Purchase) -> Reply:
    """reserve.lua's (or enqueue.lua's) raw answer for ``purchase`` as a :class:`Reply`."""
    kind = raw[0]
    if kind == "ok":
        return Reply("ok", reserved_at_ms=int(raw[2]))
    if kind == "sold_out":
        return _SOLD_OUT_SETTLED if int(raw[1]) == 1 else _SOLD_OUT
    if kind == "confirmed":
        order = Order(raw[1], purchase.request_id, purchase.sku, raw[2], int(raw[3]))
        return Reply("confirmed", order)
    if kind == "unverified":
        return _UNVERIFIED[int(raw[1]) == 1, int(raw[2]) == 1]
    if kind in ("not_started", "rate_limited"):
        return Reply(kind, wait_ms=int(raw[1]))
    return _SIMPLE[kind]


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
    result = _OUTCOMES.get(reply.kind)
    if result is None:
        raise Unavailable("stock not loaded")
    return result
