"""An order's events: what the outbox holds and every sink receives. No I/O here.

An event is written by PostgreSQL in the transaction that changed the order
(``sql/010_order_events.sql``); the relay (:mod:`gateway.usecases.relay`) hands
it to the sinks, at least once, and an order's versions in order. Its JSON is
described by ``docs/order-event.schema.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import orjson

from gateway.domain.rules import rfc3339

# An order's change of status is "order." and the status it changed to; a late
# payment recorded for it, or refunded, is "payment.late" / "payment.refunded".
EVENT_TYPES = (
    "order.confirmed",
    "order.pending_payment",
    "order.paid",
    "order.cancelled",
    "order.expired",
    "order.refunded",
    "payment.late",
    "payment.refunded",
)


@dataclass(frozen=True, slots=True)
class OrderEvent:
    """One change of one order. ``seq`` is the outbox's own order of writing,
    not part of the event a sink sees; ``version`` counts 1, 2, ... per order."""

    seq: int
    event_id: str
    type: str
    order_id: str
    request_id: str
    sku: str
    user_id: str
    qty: int
    status: str
    version: int
    occurred_at: datetime
    # Each None where it does not apply, and then left out of the event: the
    # payment (paid, refunded, payment.*), the deadline (pending_payment), the
    # caller's reason or the window's end (cancelled, expired, refunded,
    # payment.*), and who made the change (every event written since 015).
    payment_id: str | None = None
    pay_by: datetime | None = None
    reason: str | None = None
    cause: str | None = None

    def fields(self) -> dict[str, str | int]:
        """The event as a sink sees it: every field but ``seq``, those that do not
        apply left out."""
        found: dict[str, str | int] = {
            "event_id": self.event_id,
            "type": self.type,
            "order_id": self.order_id,
            "request_id": self.request_id,
            "sku": self.sku,
            "user_id": self.user_id,
            "qty": self.qty,
            "status": self.status,
            "version": self.version,
            "occurred_at": rfc3339(self.occurred_at),
        }
        if self.payment_id is not None:
            found["payment_id"] = self.payment_id
        if self.pay_by is not None:
            found["pay_by"] = rfc3339(self.pay_by)
        if self.reason is not None:
            found["reason"] = self.reason
        if self.cause is not None:
            found["cause"] = self.cause
        return found

    def body(self) -> bytes:
        """The event's JSON, as POSTed to a webhook and published to RabbitMQ."""
        return orjson.dumps(self.fields())


@dataclass(frozen=True, slots=True)
class SinkStats:
    """One sink's backlog: events owed and not dead, dead letters, and the age
    of the oldest owed one (0 when none is)."""

    sink: str
    depth: int
    dead: int
    oldest_s: float


class EventSink(Protocol):
    """Where the relay delivers events: the Redis stream, a webhook, RabbitMQ.

    ``deliver`` gets events of distinct orders (the relay holds an order's
    next version back until this one is delivered), so it may send them
    concurrently. It answers one entry per event, in the same order: ``None``
    when the event is delivered (a 2xx, an XADD, a publisher confirm), else
    why not, in a few words for the outbox and the logs. It raises nothing:
    the relay retries what was not delivered.
    """

    @property
    def name(self) -> str:
        """The sink's name: ``stream``, ``webhook`` or ``amqp``."""
        ...

    @property
    def max_age_s(self) -> float | None:
        """How long an event may stay undelivered to this sink before the relay
        dead-letters it (``GATEWAY_WEBHOOK_MAX_AGE_S`` for the webhook); None:
        retried for as long as it takes."""
        ...

    async def deliver(self, events: Sequence[OrderEvent]) -> Sequence[str | None]: ...
