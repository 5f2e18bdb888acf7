"""What the shop's payment service reads back: late payments and a buyer's
orders, each a page at a time. Pure values."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Generic, TypeVar

from gateway.domain.model import Order
from gateway.domain.rules import rfc3339

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing, and the cursor of the next (None on the last)."""

    items: list[T]
    next: str | None


@dataclass(frozen=True, slots=True)
class Paying:
    """An order as a payment (or a look at it) found it, and the payment id that
    paid it, if any."""

    order: Order
    payment_id: str | None
    # This payment paid it now (not a payment sent again).
    won: bool = False
    # The payment's id is already another order's (paid or refused late).
    taken: bool = False


class LateStatus(StrEnum):
    """Which late payments a listing shows (``?status=``)."""

    OWED = "owed"  # not refunded yet
    REFUNDED = "refunded"
    ALL = "all"


@dataclass(frozen=True, slots=True)
class LatePayment:
    """A payment refused after its order expired or was cancelled, owed back to
    the buyer until refunded. ``seq`` orders them by recording (the cursor)."""

    seq: int
    payment_id: str
    request_id: str
    order_id: str | None
    reason: str
    received_at: datetime
    refunded_at: datetime | None

    def as_json(self) -> dict[str, Any]:
        """The late payment as the API shows it."""
        return {
            "payment_id": self.payment_id,
            "request_id": self.request_id,
            "order_id": self.order_id,
            "reason": self.reason,
            "status": LateStatus.OWED if self.refunded_at is None else LateStatus.REFUNDED,
            "received_at": rfc3339(self.received_at),
            "refunded_at": None if self.refunded_at is None else rfc3339(self.refunded_at),
        }


@dataclass(frozen=True, slots=True)
class BuyerOrder:
    """One of a buyer's orders as their listing shows it."""

    order: Order
    payment_id: str | None
    created_at: datetime

    def as_json(self) -> dict[str, Any]:
        """The order, its payment id and when it was made."""
        return {
            **self.order.as_json(),
            "payment_id": self.payment_id,
            "created_at": rfc3339(self.created_at),
        }

    @property
    def cursor(self) -> OrderCursor:
        """Where the next page starts: the orders made before this one."""
        return OrderCursor(self.created_at, self.order.order_id)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# "<microseconds since the epoch>.<order id>": ASCII digits, then a UUID.
_CURSOR = re.compile(
    r"([0-9]{1,18})\.([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
)


@dataclass(frozen=True, slots=True)
class OrderCursor:
    """A position in a buyer's orders, newest first: made at ``created_at``,
    ties broken by ``order_id``."""

    created_at: datetime
    order_id: str

    def __str__(self) -> str:
        micros = (self.created_at - _EPOCH) // _MICROSECOND
        return f"{micros}.{self.order_id}"

    @classmethod
    def parse(cls, text: str) -> OrderCursor:
        """A cursor as :meth:`__str__` wrote it; raises ValueError otherwise."""
        match = _CURSOR.fullmatch(text)
        if match is None:
            raise ValueError("must be a cursor from a page's next")
        try:
            created = _EPOCH + int(match[1]) * _MICROSECOND
        except OverflowError:
            raise ValueError("must be a cursor from a page's next") from None
        return cls(created, match[2])
