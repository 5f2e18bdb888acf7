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
from enum import StrEnum
from typing import Protocol

import orjson

from gateway.domain.model import Cause, Order, OrderStatus
from gateway.domain.rules import rfc3339


class EventType(StrEnum):
    """What an event says happened (its ``type``, as the outbox and every sink
    spell it): an order's change of status is "order." and the status it changed
    to; a late payment recorded for it, or refunded, is "payment.late" /
    "payment.refunded"."""

    ORDER_CONFIRMED = f"order.{OrderStatus.CONFIRMED}"
    ORDER_PENDING_PAYMENT = f"order.{OrderStatus.PENDING_PAYMENT}"
    ORDER_PAID = f"order.{OrderStatus.PAID}"
    ORDER_CANCELLED = f"order.{OrderStatus.CANCELLED}"
    ORDER_EXPIRED = f"order.{OrderStatus.EXPIRED}"
    ORDER_REFUNDED = f"order.{OrderStatus.REFUNDED}"
    PAYMENT_LATE = "payment.late"
    PAYMENT_REFUNDED = "payment.refunded"


# Every event type, in the order above.
EVENT_TYPES: tuple[EventType, ...] = tuple(EventType)
# A rendered event's text as its member: one dict lookup, no Enum call.
_TYPES = {member.value: member for member in EventType}
_STATUSES = {member.value: member for member in OrderStatus}


class SinkName(StrEnum):
    """A sink's name, as the outbox records its deliveries under it."""

    STREAM = "stream"
    WEBHOOK = "webhook"
    AMQP = "amqp"


# The fields every event has, in the order they come (sql/functions/event_fields.sql),
# and those that come after them only where they apply.
FIELDS = (
    "event_id",
    "type",
    "order_id",
    "request_id",
    "sku",
    "user_id",
    "qty",
    "status",
    "version",
    "occurred_at",
)
OPTIONAL_FIELDS = ("payment_id", "pay_by", "reason", "cause")
# The fields whose JSON value is a number (every value is text on the stream).
NUMBERS = frozenset({"qty", "version"})


@dataclass(frozen=True, slots=True)
class OrderEvent:
    """One change of one order. ``seq`` is the outbox's own order of writing,
    not part of the event a sink sees. ``fields`` is the event as the stream
    carries it: name, value, name, value..., every value text, the
    :data:`FIELDS` first in that order, then the :data:`OPTIONAL_FIELDS` that
    apply. PostgreSQL renders them (``event_fields``) so the relay hands them
    on as they are; :meth:`of` renders them here, for tests and tools.

    A claim for a sink that takes events packed (``EventSink.packed``: the
    stream on one Redis) has ``fields`` empty and ``packed`` instead: the
    number of fields, then the fields, as the stream's XADD takes them,
    each a RESP bulk string (``sql/functions/event_packed.sql``). The
    properties below read ``fields``: such an event is only written to Redis.
    """

    seq: int
    fields: Sequence[str]
    packed: str = ""

    @classmethod
    def of(
        cls,
        seq: int,
        *,
        event_id: str,
        type: EventType,
        order_id: str,
        request_id: str,
        sku: str,
        user_id: str,
        qty: int,
        status: OrderStatus,
        version: int,
        occurred_at: datetime,
        payment_id: str | None = None,
        pay_by: datetime | None = None,
        reason: str | None = None,
        cause: Cause | None = None,
    ) -> OrderEvent:
        """The event of these values, rendered as ``event_fields`` renders them
        (each None left out)."""
        values: list[str | None] = [
            event_id,
            type.value,
            order_id,
            request_id,
            sku,
            user_id,
            str(qty),
            status.value,
            str(version),
            rfc3339(occurred_at),
            payment_id,
            None if pay_by is None else rfc3339(pay_by),
            reason,
            None if cause is None else cause.value,
        ]
        pairs = zip((*FIELDS, *OPTIONAL_FIELDS), values, strict=True)
        return cls(
            seq, tuple(x for name, value in pairs if value is not None for x in (name, value))
        )

    @property
    def event_id(self) -> str:
        """The event's id (the same on every delivery of it)."""
        return self.fields[1]

    @property
    def type(self) -> EventType:
        """``order.<status>`` or ``payment.late`` / ``payment.refunded``."""
        return _TYPES[self.fields[3]]

    @property
    def order_id(self) -> str:
        """The order's id."""
        return self.fields[5]

    @property
    def status(self) -> OrderStatus:
        """The status the order took (an order.* event), or stands in (payment.*)."""
        return _STATUSES[self.fields[15]]

    @property
    def version(self) -> int:
        """1, 2, ... per order."""
        return int(self.fields[17])

    @property
    def occurred_at(self) -> datetime:
        """When the change was written (PostgreSQL's clock, to the millisecond)."""
        return datetime.fromisoformat(self.fields[19])

    def payload(self) -> dict[str, str | int]:
        """The event as JSON has it: every field that applies, numbers as numbers."""
        names, values = self.fields[::2], self.fields[1::2]
        return {
            name: int(value) if name in NUMBERS else value
            for name, value in zip(names, values, strict=True)
        }

    def body(self) -> bytes:
        """The event's JSON, as POSTed to a webhook and published to RabbitMQ."""
        return orjson.dumps(self.payload())


@dataclass(frozen=True, slots=True)
class FirstEvents:
    """A flush's new orders, whose first events the flushing gateway hands to a
    sink itself (``gateway.usecases.handoff``; ``sql/032_event_handoff.sql``).

    Each order's first event is made of the order as committed: its event id
    is the order's id, its version 1, its cause ``buyer``, and it occurred at
    ``occurred_at`` (the flush's ``now()``, RFC 3339 as the API shows it).
    ``token`` names the flush's batch row in the outbox, which stays owed to
    the sink until the hand-off is recorded, and a relay delivers it if that
    never happens.
    """

    token: int
    occurred_at: str
    orders: Sequence[Order]


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
    def name(self) -> SinkName:
        """The sink's name: ``stream``, ``webhook`` or ``amqp``."""
        ...

    @property
    def max_age_s(self) -> float | None:
        """How long an event may stay undelivered to this sink before the relay
        dead-letters it (``GATEWAY_WEBHOOK_MAX_AGE_S`` for the webhook); None:
        retried for as long as it takes."""
        ...

    @property
    def packed(self) -> bool:
        """Whether ``deliver`` takes the events packed (``OrderEvent.packed``,
        rendered by PostgreSQL) rather than as their fields."""
        ...

    async def deliver(self, events: Sequence[OrderEvent]) -> Sequence[str | None]: ...
