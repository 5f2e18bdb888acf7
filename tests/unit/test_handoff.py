"""The hand-off decided against fakes (``gateway.usecases.handoff``): what it
appends, what it records as landed, and what it leaves to the relay (a flush
refused by the sink, a record PostgreSQL could not take, a flush given too
long ago)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from structlog.testing import capture_logs

from gateway.domain.errors import PostgresUnavailable
from gateway.domain.events import FirstEvents
from gateway.domain.model import Order
from gateway.usecases.handoff import STALE_S, HandOff
from testkit.order_events import Observed
from testkit.polling import wait_for


class Sink:
    """Appends every flush but those whose token is in ``refuse``."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.refuse: set[int] = set()

    async def hand_off(self, flushes: Sequence[FirstEvents]) -> list[bool]:
        self.calls.append([f.token for f in flushes])
        return [f.token not in self.refuse for f in flushes]


class Records:
    """The outbox's side: the tokens recorded, or down."""

    def __init__(self) -> None:
        self.landed: list[int] = []
        self.down = False

    async def handed_off(self, sink: str, tokens: Sequence[int]) -> int:
        if self.down:
            raise PostgresUnavailable("down")
        self.landed += tokens
        return len(tokens)


def flush(token: int, orders: int = 2) -> FirstEvents:
    """A flush of ``orders`` new orders."""
    return FirstEvents(
        token,
        "2026-12-07T17:00:00.000Z",
        [Order(f"o-{token}-{i}", f"r-{token}-{i}", "sku", f"u{i}", 1) for i in range(orders)],
    )


def handoff(clock: list[float]) -> tuple[HandOff, Sink, Records, Observed]:
    """A hand-off on fakes, its clock ``clock[0]``."""
    sink, records, observed = Sink(), Records(), Observed()
    h = HandOff(sink="stream", out=sink, records=records, observer=observed, clock=lambda: clock[0])
    return h, sink, records, observed


async def test_what_was_given_is_appended_in_one_go_and_recorded() -> None:
    """Three flushes given before a pass: one append of all three, one record
    of their tokens, each of their events counted delivered with its lag from
    the give to the append; the next pass has nothing to do."""
    clock = [100.0]
    h, sink, records, observed = handoff(clock)
    for token in (1, 2, 3):
        h.give(flush(token))
    clock[0] += 0.25
    await h.hand_off()
    assert sink.calls == [[1, 2, 3]] and observed.lags == [0.25] * 6
    assert records.landed == [], "recorded before the record"
    await h.record()
    assert records.landed == [1, 2, 3]
    await h.hand_off()
    await h.record()
    assert sink.calls == [[1, 2, 3]] and records.landed == [1, 2, 3]


async def test_a_refused_flush_is_not_recorded() -> None:
    """The sink refuses one flush's events: the others are recorded, that one
    stays owed (the relay's after the grace), and the refusal is logged."""
    h, sink, records, observed = handoff([100.0])
    sink.refuse = {2}
    for token in (1, 2, 3):
        h.give(flush(token))
    with capture_logs() as logs:
        await h.hand_off()
        await h.record()
    assert records.landed == [1, 3] and len(observed.lags) == 4
    assert [e["event"] for e in logs] == ["events_handoff_refused"]


async def test_appended_but_not_recorded_is_logged_and_counted() -> None:
    """PostgreSQL down when the hand-off is recorded: the events were appended
    (counted delivered), the rows stay owed, and the pass says so."""
    h, _, records, observed = handoff([100.0])
    records.down = True
    h.give(flush(1))
    with capture_logs() as logs:
        await h.hand_off()
        await h.record()
    assert records.landed == [] and len(observed.lags) == 2
    assert [e["event"] for e in logs] == ["events_handoff_unrecorded"]


async def test_a_flush_given_too_long_ago_is_left_to_the_relay() -> None:
    """A flush given more than STALE_S before the pass is not appended (the
    relay may be delivering it by then), the fresh one is."""
    clock = [100.0]
    h, sink, records, _ = handoff(clock)
    h.give(flush(1))
    clock[0] += STALE_S
    h.give(flush(2))
    with capture_logs() as logs:
        await h.hand_off()
        await h.record()
    assert sink.calls == [[2]] and records.landed == [2]
    assert [e["event"] for e in logs] == ["events_handoff_late"]


async def test_the_loop_appends_what_is_given_and_records_it_soon_after() -> None:
    """The loop, on the real clock: two flushes given one after the other go
    in one append, and are recorded within about RECORD_S though nothing more
    is given; a third given later goes in a pass of its own."""
    sink, records, observed = Sink(), Records(), Observed()
    h = HandOff(sink="stream", out=sink, records=records, observer=observed)
    task = asyncio.create_task(h.run())
    try:
        h.give(flush(1))
        h.give(flush(2))
        assert await wait_for(lambda: records.landed == [1, 2], within=2, what="recorded")
        h.give(flush(3))
        assert await wait_for(lambda: records.landed == [1, 2, 3], within=2, what="recorded")
        assert sink.calls == [[1, 2], [3]]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_stop_waits_until_what_was_given_is_recorded() -> None:
    """A stopping gateway's last flush: finish() returns once its events are
    appended and recorded by the loop (not left to a relay's grace), and
    returns all the same, bounded, when the loop is not running."""
    sink, records, observed = Sink(), Records(), Observed()
    h = HandOff(sink="stream", out=sink, records=records, observer=observed)
    task = asyncio.create_task(h.run())
    try:
        h.give(flush(1))
        await h.finish(within=5)
        assert sink.calls == [[1]] and records.landed == [1]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    h.give(flush(2))
    await h.finish(within=0.1)
    assert records.landed == [1]
