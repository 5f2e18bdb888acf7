"""Order events end to end, in one gateway on real Redis and PostgreSQL (issue
32): a sale of 500 units with a payment window, some paid, some cancelled, some
expired, and a sale without one, give exactly one event per change; each
order's versions are 1..n with no gap, every one is on the stream and at a
loopback webhook receiver (signed), in order within its order, and each
matches docs/order-event.schema.json."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
from redis.asyncio import Redis

from gateway.domain.events import EventType, OrderEvent
from gateway.domain.model import Cause, OrderStatus
from gateway.outbound.webhook import SIGNATURE_HEADER, signature
from testkit.order_events import check_arrivals
from testkit.order_lifecycle import PAY_HEADERS, cancel, pay, put_window, refund, start
from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS, Client, buy
from testkit.webhook_receivers import Received, Receiver, receiving

SCHEMA = Path(__file__).parents[2] / "docs" / "order-event.schema.json"
UNITS = 500
CONFIRMED_UNITS = 20
SECRET = "test-webhook-secret-32"
EVENTS_OF = """
SELECT e.order_id::text, e.version, e.type, e.status, e.event_id::text
FROM order_events e JOIN orders o USING (order_id) WHERE o.sku = ANY($1::text[])
ORDER BY e.order_id, e.version
"""
OWED_OF = """
SELECT count(*) FROM events_owed d JOIN order_events e USING (seq)
WHERE e.sku = ANY($1::text[])
"""


def problems(event: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """What of ``event`` the schema refuses, checked by hand (no jsonschema in
    the lock file): required and extra fields, types, enums, bounds, formats."""
    found = [f"missing {name}" for name in schema["required"] if name not in event]
    found += [f"extra {name}" for name in event if name not in schema["properties"]]
    for name, rule in schema["properties"].items():
        value = event.get(name)
        if value is None:
            continue
        if "enum" in rule and value not in rule["enum"]:
            found.append(f"{name}={value!r} not in its enum")
        kind = {"string": str, "integer": int}.get(rule.get("type", ""))
        if kind is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            found.append(f"{name}={value!r} is not {rule['type']}")
            continue
        if value in ("", None) or (isinstance(value, int) and value < rule.get("minimum", value)):
            found.append(f"{name}={value!r} out of bounds")
        if isinstance(value, str) and not rule.get("minLength", 0) <= len(value) <= rule.get(
            "maxLength", len(value)
        ):
            found.append(f"{name}={value!r} of a length out of bounds")
        if rule.get("format") == "uuid":
            uuid.UUID(value)
        if rule.get("format") == "date-time" and datetime.fromisoformat(value).tzinfo is None:
            found.append(f"{name}={value!r} has no offset")
    return found


async def sell(client: Client, sku: str, units: int) -> list[str]:
    """One purchase per buyer until ``units`` are sold; the request ids (rid part)."""
    rids = [f"r{i}" for i in range(units)]
    for start_at in range(0, units, 50):
        chunk = range(start_at, min(start_at + 50, units))
        answers = await asyncio.gather(*(buy(client, sku, f"u{i}", rids[i]) for i in chunk))
        assert {status for status, _ in answers} == {201}, answers
    return rids


async def stream_events(redis: Redis, key: str, skus: set[str]) -> list[dict[str, Any]]:
    """The entries of the event stream of these skus, in stream order, as events."""
    entries: list[tuple[bytes, dict[bytes, bytes]]] = await redis.xrange(key)  # type: ignore[assignment]
    found = []
    for _, fields in entries:
        event: dict[str, Any] = {k.decode(): v.decode() for k, v in fields.items()}
        if event["sku"] in skus:
            event["qty"], event["version"] = int(event["qty"]), int(event["version"])
            found.append(event)
    return found


def posted(received: list[Received], skus: set[str]) -> list[dict[str, Any]]:
    """The events the receiver got for these skus, in arrival order, each
    checked against its signature."""
    found = []
    for request in received:
        t = int(request.headers[SIGNATURE_HEADER].split(",")[0].removeprefix("t="))
        assert request.headers[SIGNATURE_HEADER] == signature(SECRET, request.body, t)
        event: dict[str, Any] = json.loads(request.body)
        if event["sku"] in skus:
            found.append(event)
    return found


def check_valid_arrivals(
    events: list[dict[str, Any]], ids: dict[tuple[str, int], str], schema: dict[str, Any]
) -> None:
    """Each event valid by the schema, and every one there (check_arrivals)."""
    for event in events:
        assert not problems(event, schema), (event, problems(event, schema))
    check_arrivals(events, ids)


class TestExactlyOneEventPerChange:
    """A sale with a payment window and one without, every event on the stream
    and at the webhook receiver."""

    async def test_every_change_is_one_event_on_the_stream_and_at_the_webhook(
        self, start_gateway: Any, events_db: str, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """500 pending orders: a third paid, a third cancelled, the rest expired,
        and 20 confirmed orders of a sku without a window. Each order has
        versions 1..n, no gap, of the types its changes make; once the relay
        is done, the stream and the webhook receiver hold each version
        (duplicates only with the same event_id), in version order per order,
        each valid by the schema and each POST signed."""
        receiver = Receiver()
        async with receiving(receiver) as url:
            client = await start(
                start_gateway,
                database_url=events_db,
                events_poll_s=0.02,
                webhook_url=url,
                webhook_secret=SECRET,
            )
            rows = await self.sell_and_close(client, events_db, sku)
        schema = json.loads(SCHEMA.read_text())
        skus = {sku, f"{sku}-final"}
        ids = {(row["order_id"], row["version"]): row["event_id"] for row in rows}
        check_valid_arrivals(await stream_events(redis, f"{key_prefix}:events", skus), ids, schema)
        check_valid_arrivals(posted(receiver.received, skus), ids, schema)

    async def sell_and_close(self, client: Client, events_db: str, sku: str) -> list[Any]:
        """The two sales, the payments, cancels and expiries; once every event
        was relayed, the events of both skus, checked to be one per change."""
        final = f"{sku}-final"
        await put_window(client, sku, UNITS, 600)
        await put_window(client, final, CONFIRMED_UNITS, 0)
        rids = await sell(client, sku, UNITS)
        await sell(client, final, CONFIRMED_UNITS)
        third = UNITS // 3
        paid = await asyncio.gather(*(pay(client, sku, r, f"p-{r}") for r in rids[:third]))
        cancelled = await asyncio.gather(*(cancel(client, sku, r) for r in rids[third : 2 * third]))
        assert {s for s, _ in paid} == {s for s, _ in cancelled} == {200}
        con = await asyncpg.connect(events_db)
        try:
            await con.execute(
                "UPDATE orders SET pay_by = now() WHERE sku = $1 AND status = 'pending_payment'",
                sku,
            )

            async def settled() -> bool:
                pending = await con.fetchval(
                    "SELECT count(*) FROM orders WHERE sku = $1 AND status = 'pending_payment'",
                    sku,
                )
                owed: int = await con.fetchval(OWED_OF, [sku, final])
                return pending == 0 and owed == 0

            await wait_for(settled, within=30, what="every order closed, every event relayed")
            rows = await con.fetch(EVENTS_OF, [sku, final])
        finally:
            await con.close()

        versions: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for row in rows:
            versions[row["order_id"]].append((row["version"], row["type"]))
        kinds: dict[tuple[str, ...], int] = defaultdict(int)
        for order_versions in versions.values():
            assert [v for v, _ in order_versions] == list(range(1, len(order_versions) + 1))
            kinds[tuple(t.removeprefix("order.") for _, t in order_versions)] += 1
        assert kinds == {
            ("pending_payment", "paid"): third,
            ("pending_payment", "cancelled"): third,
            ("pending_payment", "expired"): UNITS - 2 * third,
            ("confirmed",): CONFIRMED_UNITS,
        }

        return rows


class TestWhatEventsCarry:
    """Issue 40: an event says what a fulfilment or payment service acts on."""

    async def test_each_change_carries_its_payment_deadline_reason_and_cause(
        self, start_gateway: Any, events_db: str, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """One order per kind of change, on the stream and at the webhook, each
        valid by the schema and in version order: pending_payment with pay_by;
        paid and refunded with the payment id; a cancel's reason and an
        admin's cause; an expiry's payment_window_elapsed by the sweep; a late
        payment and its refund as the order's next versions, with the payment
        id; every change with who made it."""
        receiver = Receiver()
        async with receiving(receiver) as url:
            client = await start(
                start_gateway,
                database_url=events_db,
                events_poll_s=0.02,
                webhook_url=url,
                webhook_secret=SECRET,
            )
            await put_window(client, sku, 10, 600, "sql-direct")
            for rid in ("paid", "gone", "late", "staff", "lapsed"):
                assert (await buy(client, sku, rid, rid))[0] == 201
            assert (await pay(client, sku, "paid", f"p-{sku}"))[0] == 200
            assert (await refund(client, sku, "paid", restock=True, reason="too small"))[0] == 200
            assert (await cancel(client, sku, "gone", reason="changed my mind"))[0] == 200
            assert (await cancel(client, sku, "late"))[0] == 200
            assert (await pay(client, sku, "late", f"l-{sku}"))[0] == 409
            resp = await client.post(f"/v1/late-payments/l-{sku}/refund", headers=PAY_HEADERS)
            assert resp.status == 200
            resp = await client.post(f"/admin/orders/{sku}.staff/cancel", headers=ADMIN_HEADERS)
            assert resp.status == 200
            con = await asyncpg.connect(events_db)
            try:
                await con.execute(
                    "UPDATE orders SET pay_by = now() WHERE request_id = $1", f"{sku}.lapsed"
                )

                async def relayed() -> bool:
                    closed = await con.fetchval(
                        "SELECT status FROM orders WHERE request_id = $1", f"{sku}.lapsed"
                    )
                    owed: int = await con.fetchval(OWED_OF, [sku])
                    return closed == "expired" and owed == 0

                await wait_for(relayed, within=30, what="the expiry, every event relayed")
                rows = await con.fetch(EVENTS_OF, [sku])
            finally:
                await con.close()
        schema = json.loads(SCHEMA.read_text())
        ids = {(row["order_id"], row["version"]): row["event_id"] for row in rows}
        streamed = await stream_events(redis, f"{key_prefix}:events", {sku})
        check_valid_arrivals(streamed, ids, schema)
        check_valid_arrivals(posted(receiver.received, {sku}), ids, schema)
        seen = {
            (e["request_id"].removeprefix(f"{sku}."), e["type"]): {
                k: e.get(k) for k in ("payment_id", "pay_by", "reason", "cause", "status")
            }
            for e in streamed
        }
        for rid in ("paid", "gone", "late", "staff", "lapsed"):
            first = seen[(rid, "order.pending_payment")]
            assert first["cause"] == "buyer" and first["pay_by"], first
        assert seen[("paid", "order.paid")]["payment_id"] == f"p-{sku}"
        assert seen[("paid", "order.refunded")] == {
            "payment_id": f"p-{sku}",
            "pay_by": None,
            "reason": "too small",
            "cause": "payment",
            "status": "refunded",
        }
        assert seen[("gone", "order.cancelled")]["reason"] == "changed my mind"
        assert seen[("gone", "order.cancelled")]["cause"] == "buyer"
        assert seen[("staff", "order.cancelled")]["cause"] == "admin"
        assert seen[("lapsed", "order.expired")] == {
            "payment_id": None,
            "pay_by": None,
            "reason": "payment_window_elapsed",
            "cause": "sweep",
            "status": "expired",
        }
        for kind in ("payment.late", "payment.refunded"):
            assert seen[("late", kind)] == {
                "payment_id": f"l-{sku}",
                "pay_by": None,
                "reason": "cancelled",
                "cause": "payment",
                "status": "cancelled",
            }
        versions = sorted(
            (int(e["version"]), e["type"]) for e in streamed if e["request_id"] == f"{sku}.late"
        )
        assert [t for _, t in versions] == [
            "order.pending_payment",
            "order.cancelled",
            "payment.late",
            "payment.refunded",
        ]


class TestFieldsRenderedByPostgres:
    """Issue 42: PostgreSQL renders an event's fields in the claim
    (``event_fields``); they must be what the API and the schema say, as
    ``OrderEvent.of`` renders them in Python."""

    async def test_postgres_renders_every_field_as_python_does(
        self, con: asyncpg.Connection
    ) -> None:
        """Events with and without each optional field, instants with
        microseconds and far from UTC: the same names, order and text."""
        occurred = datetime.fromisoformat("2026-12-07T03:04:05.678999+05:30")
        pay_by = datetime.fromisoformat("2026-12-31T23:59:59.999999-08:00")
        cases: list[dict[str, Any]] = [
            {},
            {"pay_by": pay_by, "cause": Cause.BUYER},
            {"payment_id": "pi_3Oq", "reason": "no longer wanted", "cause": Cause.ADMIN},
            {"payment_id": "pi_x", "pay_by": pay_by, "reason": "expired", "cause": Cause.SWEEP},
        ]
        rolled_back = con.transaction()  # no sink is ever owed these
        await rolled_back.start()
        try:
            for n, extra in enumerate(cases):
                values: dict[str, Any] = {
                    "event_id": str(uuid.uuid4()),
                    "type": EventType.ORDER_PAID,
                    "order_id": str(uuid.uuid4()),
                    "request_id": f"r{n}",
                    "sku": "sku-rendered",
                    "user_id": f"u{n}",
                    "qty": 3,
                    "status": OrderStatus.PAID,
                    "version": 2,
                    "occurred_at": occurred,
                    **extra,
                }
                columns = ", ".join(values)
                params = ", ".join(f"${i}" for i in range(1, len(values) + 1))
                insert = f"INSERT INTO order_events ({columns}) VALUES ({params}) RETURNING seq"
                seq = await con.fetchval(insert, *values.values())
                rendered = "SELECT event_fields(e) FROM order_events e WHERE seq = $1"
                fields = await con.fetchval(rendered, seq)
                assert tuple(fields) == OrderEvent.of(seq, **values).fields, extra
                assert OrderEvent(seq, fields).payload()["qty"] == 3
        finally:
            await rolled_back.rollback()
