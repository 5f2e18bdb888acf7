"""What a flush decided (gateway.postgres.orders): each purchase's :class:`Decision` as
``flush_batch`` returned it, the batch's :class:`BatchDecision`, and the SQLSTATEs
that refuse a whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from gateway.domain.errors import (
    FencedOut,
    GatewayError,
    IdempotencyMismatch,
    StockGuardRefused,
    Unavailable,
)
from gateway.domain.model import DUPLICATE, SOLD_OUT, Order, Outcome, Result, Verdict

# The SQLSTATEs flush_batch raises, each for one cause; nothing is written.
FLUSH_ERRORS: dict[str, type[Unavailable]] = {
    "FS001": FencedOut,  # a fencing token older than the row's
    "FS002": StockGuardRefused,  # the stock >= guard refused the batch
}


@dataclass(frozen=True, slots=True)
class Decision:
    """The database's verdict on one purchase of a batch."""

    result: Result | GatewayError
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """What one committed flush decided, by request id."""

    decisions: dict[str, Decision]
    # Database stock after the batch when it found too little stock, else None.
    short_stock_after: int | None


def decision_of(row: asyncpg.Record) -> Decision:
    """One row of ``flush_batch`` as the decision on its purchase."""
    verdict = Verdict(row["verdict"])
    if verdict is Verdict.RELEASED:
        # The request id holds another purchase's order: never answered with it.
        return Decision(IdempotencyMismatch(row["request_id"]), verdict)
    if verdict is Verdict.CONFIRMED:
        order = Order(
            row["order_id"],
            row["request_id"],
            row["order_sku"],
            row["order_user"],
            row["order_qty"],
        )
        return Decision(Result(Outcome.CONFIRMED, order), verdict)
    if verdict is Verdict.EXPIRED:
        # Already given back by the reconciler: nothing to settle but the answer.
        return Decision(Unavailable("reservation expired; retry"), verdict)
    return Decision(DUPLICATE if verdict is Verdict.DUPLICATE else SOLD_OUT, verdict)
