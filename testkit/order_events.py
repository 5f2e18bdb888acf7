"""Order events made up for the sinks' tests (each of its own order unless
asked), and the check of what a sink received."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gateway.domain.events import EVENT_TYPES, EventType, OrderEvent
from gateway.domain.model import OrderStatus


def order_event(
    seq: int, *, type_: EventType = EventType.ORDER_CONFIRMED, version: int = 1
) -> OrderEvent:
    """Event ``seq`` of a new order (a fresh event id and order id); a payment.*
    event's order stands expired."""
    order, _, took = type_.partition(".")
    status = OrderStatus(took) if order == "order" else OrderStatus.EXPIRED
    return OrderEvent.of(
        seq,
        event_id=str(uuid.uuid4()),
        type=type_,
        order_id=str(uuid.uuid4()),
        request_id=f"req-{seq}",
        sku="sku-events",
        user_id=f"user-{seq}",
        qty=1,
        status=status,
        version=version,
        occurred_at=datetime.now(UTC),
    )


def order_events(count: int, first: int = 1) -> list[OrderEvent]:
    """``count`` events of distinct orders, their types taken in turn."""
    return [
        order_event(seq, type_=EVENT_TYPES[seq % len(EVENT_TYPES)])
        for seq in range(first, first + count)
    ]


# Each event of a sku's orders, as the sinks' checks key them.
EVENTS_OF_SKU = "SELECT order_id::text, version, event_id::text FROM order_events WHERE sku = $1"


def check_arrivals(
    arrived: Sequence[Mapping[str, Any]], ids: Mapping[tuple[str, int], str]
) -> None:
    """``arrived`` (in arrival order; a stream's text fields or a webhook's
    JSON) holds every event of ``ids`` ((order_id, version) -> event_id); a
    duplicate only with its own event_id; within an order no version before
    the one below it."""
    highest: dict[str, int] = defaultdict(int)
    for entry in arrived:
        order, version = entry["order_id"], int(entry["version"])
        assert ids[(order, version)] == entry["event_id"], f"another event_id: {entry}"
        assert version <= highest[order] + 1, f"version {version} of {order} came early"
        highest[order] = max(highest[order], version)
    missing = set(ids) - {(e["order_id"], int(e["version"])) for e in arrived}
    assert not missing, f"{len(missing)} events never arrived, e.g. {sorted(missing)[:3]}"


# Events written straight into the outbox: $1 orders of
# $2 versions each, version by version.
WRITE_EVENTS = """
INSERT INTO order_events (order_id, version, type, request_id, sku, user_id, qty, status)
SELECT o.id, v, 'order.' || s, o.id::text || '.' || v, 'sku', 'u' || o.n, 1, s
FROM (SELECT gen_random_uuid() AS id, n FROM generate_series(1, $1) n) o,
    generate_series(1, $2) v,
    LATERAL (SELECT (ARRAY['pending_payment', 'paid', 'paid'])[v] AS s) st
ORDER BY v, o.n
"""


class Observed:
    """The relay's observer, kept."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.failures = 0

    def delivered(self, sink: str, lags_s: Sequence[float]) -> None:
        self.lags += lags_s

    def failed(self, sink: str, count: int) -> None:
        self.failures += count

    def sample(self, stats: object) -> None:
        """Not looked at here."""
