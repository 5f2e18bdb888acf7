"""Order events made up for the sinks' tests: each of its own order unless asked."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from gateway.domain.events import EVENT_TYPES, OrderEvent


def order_event(seq: int, *, type_: str = "order.confirmed", version: int = 1) -> OrderEvent:
    """Event ``seq`` of a new order (a fresh event id and order id)."""
    status = type_.removeprefix("order.")
    return OrderEvent(
        seq=seq,
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
