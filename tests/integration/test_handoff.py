"""The hand-off of a flush's first events to the stream (issue 42;
``sql/032_event_handoff.sql``, ``gateway.usecases.handoff``), on a real
PostgreSQL and Redis, each test on a database of its own: a handed-off flush
appends exactly the entries the relay would have, byte for byte, and leaves
nothing owed; one whose hand-off never lands is the relay's once the grace is
over; a later version of an order waits for its first version's hand-off."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime

import asyncpg
import pytest
from redis.asyncio import Redis

from gateway.domain.model import Purchase
from gateway.postgres.orders import Orders
from gateway.postgres.outbox import Outbox
from gateway.redis.event_stream import EventStream, packed_firsts
from gateway.usecases.handoff import HandOff
from gateway.usecases.relay import Relay
from testkit.order_events import Observed

# A sku with a payment window (its orders have a pay_by) and one without; ids
# beyond ASCII, so the packing counts bytes.
SKUS = {"handoff-window": 600, "handoff-plain": 0}


@pytest.fixture
async def pool(events_db: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the test's database, with the two skus and the stream registered."""
    p = await asyncpg.create_pool(events_db, min_size=1, max_size=4)
    assert p is not None
    for sku, window in SKUS.items():
        await p.execute(
            "INSERT INTO inventory (sku, stock, payment_window_s) VALUES ($1, 100, $2)", sku, window
        )
    await Outbox(p).register("stream")
    yield p
    await p.close()


def purchases(sku: str, count: int) -> list[Purchase]:
    """``count`` new buyers of one unit each."""
    return [Purchase(sku, f"bü-{sku}-{i}", 1, f"rè-{sku}-{i}") for i in range(count)]


async def entries(redis: Redis, key: str) -> list[list[str]]:
    """The stream's entries, each as its fields (name, value, ...)."""
    found: list[tuple[bytes, dict[bytes, bytes]]] = await redis.xrange(key)  # type: ignore[assignment]
    return [[x.decode() for kv in fields.items() for x in kv] for _, fields in found]


async def owed(pool: asyncpg.Pool) -> int:
    """Events still owed to a sink."""
    count: int = await pool.fetchval("SELECT count(*) FROM events_owed")
    return count


async def test_a_handed_off_flush_appends_what_the_relay_would_and_owes_nothing(
    pool: asyncpg.Pool, redis: Redis, key_prefix: str
) -> None:
    """Two skus' flushes handed off in one pass: the stream gets each new
    order's first event once, its fields those the outbox holds for it
    (event_fields) and its packing byte for byte event_packed's; its event id
    is its order's; nothing is owed after, and a relay finds nothing to
    claim. A flush sent again (every request a replay) hands off nothing."""
    key = f"{key_prefix}:events"
    stream = EventStream(redis, key, max_len=0, max_age_s=0, webhook_owed=None)
    orders, outbox, observed = Orders(pool), Outbox(pool), Observed()
    handoff = HandOff(sink="stream", out=stream, records=outbox, observer=observed)
    flushes = []
    for sku in SKUS:
        decision = await orders.commit_batch(sku, purchases(sku, 3), None, "stream")
        assert decision.handed is not None and len(decision.handed.orders) == 3
        flushes.append(decision.handed)
        handoff.give(decision.handed)
        again = await orders.commit_batch(sku, purchases(sku, 3), None, "stream")
        assert again.handed is None, "a replay handed its order's first event off again"
    assert await owed(pool) == 6, "a handed-off flush owed nothing before it landed"
    await handoff.hand_off()
    assert await owed(pool) == 6, "recorded before the record"
    await handoff.record()

    rows = await pool.fetch(
        "SELECT event_id::text, order_id::text, event_fields(e), event_packed(e)"
        " FROM order_events e ORDER BY seq"
    )
    assert len(rows) == 6 and all(row[0] == row[1] for row in rows), "event_id is not the order's"
    assert await entries(redis, key) == [list(row[2]) for row in rows]
    packed = {
        order.order_id: text
        for flush in flushes
        for order, text in zip(flush.orders, packed_firsts(flush), strict=True)
    }
    assert all(packed[row[1]] == row[3] for row in rows)
    assert any("pay_by" in row[2] for row in rows) and not all("pay_by" in row[2] for row in rows)
    assert await owed(pool) == 0
    assert len(observed.lags) == 6
    relay = Relay(outbox=outbox, sinks=[stream], observer=Observed(), batch=50, poll_s=0.01)
    assert await relay.relay_once(stream) == 0


async def test_a_hand_off_that_never_lands_is_the_relays_after_the_grace(
    pool: asyncpg.Pool, redis: Redis, key_prefix: str
) -> None:
    """A flush asks for a hand-off and its gateway never appends (it died): a
    relay leaves its batch alone during the grace, takes it once the grace is
    over, and delivers each first event with its order's id."""
    key = f"{key_prefix}:events"
    stream = EventStream(redis, key, max_len=0, max_age_s=0, webhook_owed=None)
    decision = await Orders(pool).commit_batch("handoff-plain", purchases("x", 4), None, "stream")
    assert decision.handed is not None
    relay = Relay(outbox=Outbox(pool), sinks=[stream], observer=Observed(), batch=50, poll_s=0.01)
    assert await relay.relay_once(stream) == 0, "a relay took a batch within its grace"
    assert await owed(pool) == 4
    # The grace over (5 s after the commit), without waiting it out.
    await pool.execute("UPDATE event_batches SET claimable_at = now() - interval '1 ms'")
    assert await relay.relay_once(stream) == 4
    got = await entries(redis, key)
    ids = {fields[1] for fields in got}
    assert ids == {order.order_id for order in decision.handed.orders}
    assert await owed(pool) == 0


async def test_a_later_version_waits_for_its_first_versions_hand_off(
    pool: asyncpg.Pool, redis: Redis, key_prefix: str
) -> None:
    """An order paid right after its flush: its second event is not claimed
    while the first is being handed off, and follows it once the hand-off
    landed; the stream holds version 1, then version 2."""
    key = f"{key_prefix}:events"
    stream = EventStream(redis, key, max_len=0, max_age_s=0, webhook_owed=None)
    outbox = Outbox(pool)
    decision = await Orders(pool).commit_batch("handoff-window", purchases("y", 1), None, "stream")
    assert decision.handed is not None
    (order,) = decision.handed.orders
    await pool.execute(
        "UPDATE orders SET status = 'paid', payment_id = 'pay-1' WHERE order_id = $1::uuid",
        order.order_id,
    )
    relay = Relay(outbox=outbox, sinks=[stream], observer=Observed(), batch=50, poll_s=0.01)
    assert await relay.relay_once(stream) == 0, "version 2 went before version 1 was handed off"
    handoff = HandOff(sink="stream", out=stream, records=outbox, observer=Observed())
    handoff.give(decision.handed)
    await handoff.hand_off()
    assert await relay.relay_once(stream) == 0, "version 2 went before the hand-off was recorded"
    await handoff.record()
    assert await relay.relay_once(stream) == 1
    versions = [
        dict(zip(f[::2], f[1::2], strict=True))["version"] for f in await entries(redis, key)
    ]
    assert versions == ["1", "2"]
    assert await owed(pool) == 0


async def test_appended_but_never_recorded_comes_again_with_the_same_event_ids(
    pool: asyncpg.Pool, redis: Redis, key_prefix: str
) -> None:
    """The gateway appends a flush's first events and dies before it records
    them: once the grace is over a relay appends them again, each entry the
    same as the first copy (same event_id, same fields), so a consumer that
    drops an event_id it has seen sees each event once."""
    key = f"{key_prefix}:events"
    stream = EventStream(redis, key, max_len=0, max_age_s=0, webhook_owed=None)
    outbox = Outbox(pool)
    decision = await Orders(pool).commit_batch("handoff-plain", purchases("z", 3), None, "stream")
    assert decision.handed is not None
    handoff = HandOff(sink="stream", out=stream, records=outbox, observer=Observed())
    handoff.give(decision.handed)
    await handoff.hand_off()
    await pool.execute("UPDATE event_batches SET claimable_at = now() - interval '1 ms'")
    relay = Relay(outbox=outbox, sinks=[stream], observer=Observed(), batch=50, poll_s=0.01)
    assert await relay.relay_once(stream) == 3
    got = await entries(redis, key)
    assert len(got) == 6 and sorted(map(tuple, got[:3])) == sorted(map(tuple, got[3:]))
    assert len({fields[1] for fields in got}) == 3
    await handoff.record()
    assert await owed(pool) == 0


async def test_hand_offs_trim_the_stream_at_most_once_a_second(
    pool: asyncpg.Pool, redis: Redis, key_prefix: str
) -> None:
    """With a webhook configured each trim asks for the webhook's oldest owed
    event: passes of a hand-off, back to back, ask once, not once a pass; a
    relay's batch still asks every time."""
    asked: list[int] = []
    outbox = Outbox(pool)

    async def webhook_owed() -> datetime | None:
        asked.append(1)
        return await outbox.oldest_owed("webhook")

    key = f"{key_prefix}:events"
    stream = EventStream(redis, key, max_len=100, max_age_s=0, webhook_owed=webhook_owed)
    handoff = HandOff(sink="stream", out=stream, records=outbox, observer=Observed())
    orders = Orders(pool)
    for n in range(3):
        decision = await orders.commit_batch("handoff-plain", purchases(f"t{n}", 2), None, "stream")
        assert decision.handed is not None
        handoff.give(decision.handed)
        await handoff.hand_off()
    assert await redis.xlen(key) == 6 and len(asked) == 1
    await handoff.record()
    await orders.commit_batch("handoff-plain", purchases("t9", 2), None, None)
    relay = Relay(outbox=outbox, sinks=[stream], observer=Observed(), batch=50, poll_s=0.01)
    assert await relay.relay_once(stream) == 2 and len(asked) == 2


async def test_an_idle_relays_probe_says_due_whenever_a_claim_takes_something(
    pool: asyncpg.Pool, redis: Redis, key_prefix: str
) -> None:
    """``Outbox.due``, an idle relay's one round trip before a claim: false
    while nothing is owed, while a flush's batch waits out its hand-off's grace,
    while an event waits out its backoff and for a dead letter; true as soon as
    the grace or the backoff is over. It may say yes when the claim takes
    nothing (a later version behind its first's batch), never the other way."""
    key = f"{key_prefix}:events"
    stream = EventStream(redis, key, max_len=0, max_age_s=0, webhook_owed=None)
    outbox = Outbox(pool)
    relay = Relay(outbox=outbox, sinks=[stream], observer=Observed(), batch=50, poll_s=0.01)

    async def probed_then_claimed() -> tuple[bool, int]:
        return await outbox.due("stream"), await relay.relay_once(stream)

    assert await probed_then_claimed() == (False, 0)
    decision = await Orders(pool).commit_batch("handoff-window", purchases("p", 2), None, "stream")
    assert decision.handed is not None
    first = decision.handed.orders[0]
    await pool.execute(
        "UPDATE orders SET status = 'paid', payment_id = 'pay-p' WHERE order_id = $1::uuid",
        first.order_id,
    )
    # Version 2 of the first order is due, behind its batch in the grace.
    assert await probed_then_claimed() == (True, 0)
    await pool.execute("UPDATE event_deliveries SET due_at = now() + interval '1 hour'")
    assert await probed_then_claimed() == (False, 0), "a batch in its grace or a backoff is due"
    await pool.execute("UPDATE event_batches SET claimable_at = now() - interval '1 ms'")
    assert await probed_then_claimed() == (True, 2)
    await pool.execute("UPDATE event_deliveries SET dead_at = now(), due_at = now()")
    assert await probed_then_claimed() == (False, 0), "a dead letter is due"
    await pool.execute("UPDATE event_deliveries SET dead_at = NULL")
    assert await probed_then_claimed() == (True, 1)
    assert await probed_then_claimed() == (False, 0)
    assert await owed(pool) == 0
