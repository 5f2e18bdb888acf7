"""What the stock scripts answer and take, as values (``gateway.inventory`` calls
the scripts): reserve.lua's :class:`Reply` and its decoding, settle.lua's
:class:`Settlement`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.domain import Order, Purchase, Verdict

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
