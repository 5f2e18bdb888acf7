"""The enums the use cases decide on spell what the scripts, the SQL and the
event schema write: ``ReplyKind`` is every answer ``lua/reserve.lua`` and
``lua/enqueue.lua`` list in their contracts, ``StandingStatus`` the rooms'
scripts' (but ``joined``, which the adapter reads as ``WAITING``),
``GateDecision`` the verdicts ``sale_gate()`` assigns, and ``EventType``,
``OrderStatus`` and ``Cause`` the enums of ``docs/order-event.schema.json``.

A raw answer becomes its member by one dict lookup (no Enum call on the hot
path), so a spelling that drifted on one side would raise KeyError at run time:
it fails here first."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

from gateway.domain.events import EVENT_TYPES, EventType, OrderEvent
from gateway.domain.model import Cause, OrderStatus
from gateway.domain.rooms import STANDING_STATUSES, StandingStatus
from gateway.domain.rules import GATE_DECISIONS, GateDecision
from gateway.domain.stock import REPLY_KINDS, ReplyKind

ROOT = Path(__file__).resolve().parents[2]
# A contract's answer line: `--   {"ok", stock_left, reserved_at_ms}`.
ANSWER = re.compile(r'^--\s+\{"([a-z_]+)"', re.MULTILINE)


def answers(script: str) -> set[str]:
    """The first elements a Lua script's header contract says it returns."""
    return set(ANSWER.findall((ROOT / "lua" / f"{script}.lua").read_text()))


def test_reply_kinds_are_the_reservation_scripts_answers() -> None:
    """Every kind reserve.lua or enqueue.lua answers is a ReplyKind, and no other."""
    assert {kind.value for kind in ReplyKind} == answers("reserve") | answers("enqueue")
    assert set(REPLY_KINDS) == {kind.value for kind in ReplyKind}


def test_standings_are_the_room_scripts_answers() -> None:
    """Every status room_poll.lua answers, and room_join.lua's but ``joined``, is a
    StandingStatus."""
    spelled = answers("room_poll") | (answers("room_join") - {"joined"})
    assert {status.value for status in StandingStatus} == spelled
    assert set(STANDING_STATUSES) == spelled


def test_gate_decisions_are_sale_gates_verdicts() -> None:
    """GateDecision holds every verdict sale_gate() assigns, and no other."""
    sql = (ROOT / "sql" / "functions" / "sale_gate.sql").read_text()
    assigned = set(re.findall(r"verdict := '([a-z_]+)'", sql))
    assert {decision.value for decision in GateDecision} == assigned == set(GATE_DECISIONS)


def test_event_enums_are_the_schemas() -> None:
    """EventType, OrderStatus and Cause are the event schema's enums, in its order."""
    schema = json.loads((ROOT / "docs" / "order-event.schema.json").read_text())
    fields = schema["properties"]
    assert [str(t) for t in EVENT_TYPES] == fields["type"]["enum"]
    assert [str(s) for s in OrderStatus] == fields["status"]["enum"]
    assert [str(c) for c in Cause] == fields["cause"]["enum"]
    for status in OrderStatus:
        assert f"order.{status}" in set(EventType)


def test_an_events_enums_are_rendered_as_plain_text() -> None:
    """An event made of the enums renders them as their plain text, as
    ``event_fields`` does, so the stream, the webhook's JSON and RabbitMQ carry
    exactly what they always did; read back, they are the enums again."""
    event = OrderEvent.of(
        1,
        event_id="e1",
        type=EventType.ORDER_PAID,
        order_id="o1",
        request_id="r1",
        sku="sku",
        user_id="u1",
        qty=1,
        status=OrderStatus.PAID,
        version=2,
        occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
        cause=Cause.PAYMENT,
    )
    assert {type(value) for value in event.fields} == {str}
    found = event.payload()
    assert (found["type"], found["status"], found["cause"]) == ("order.paid", "paid", "payment")
    assert b'"type":"order.paid"' in event.body()
    assert (event.type, event.status) == (EventType.ORDER_PAID, OrderStatus.PAID)
    assert event.type is EventType.ORDER_PAID and event.status is OrderStatus.PAID
