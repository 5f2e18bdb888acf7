"""The relay decided against fakes (issue 39): its collaborators are the
Protocols of ``gateway.usecases.ports``, so an in-memory outbox that keeps the
real one's claim rule (due now, the lowest owed version of each order, no dead
letter) shows what the relay does with a sink's answers: each order's versions
in order whatever is refused, a backoff that grows with the attempts, dead
letters of a sink with a max age, and a word about a sink nobody serves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from redis.backoff import ExponentialBackoff
from structlog.testing import capture_logs

from gateway.domain.errors import Unavailable
from gateway.domain.events import EventType, OrderEvent, SinkName, SinkStats
from gateway.domain.model import OrderStatus
from gateway.lock.backoff import pause
from gateway.usecases.relay import Relay
from testkit.order_events import Observed
from testkit.polling import wait_for

START = datetime(2026, 12, 1, tzinfo=UTC)
# No jitter: the delays the relay asks for are known in advance.
BACKOFF = ExponentialBackoff(cap=60.0, base=1.0)


@dataclass
class Owed:
    """One event owed to the one sink of these tests."""

    event: OrderEvent
    attempts: int = 0
    due_at: float = 0.0
    dead: bool = False


@dataclass
class FakeClaim:
    """A claim of the fake outbox: what it holds, and the outbox to tell."""

    outbox: FakeOutbox
    held: list[Owed]

    @property
    def events(self) -> Sequence[OrderEvent]:
        return [o.event for o in self.held]

    @property
    def attempts(self) -> Sequence[int]:
        return [o.attempts for o in self.held]

    async def record(
        self, delivered: Sequence[int], failed: Sequence[tuple[int, float, str]]
    ) -> list[float]:
        """Forget what was delivered; each refusal is due again after its delay."""
        self.outbox.owed = [o for o in self.outbox.owed if o.event.seq not in delivered]
        for seq, delay, _ in failed:
            [owed] = [o for o in self.outbox.owed if o.event.seq == seq]
            owed.attempts += 1
            owed.due_at = self.outbox.now + delay
            self.outbox.delays.append((seq, delay))
        return [0.0] * len(delivered)


@dataclass
class FakeOutbox:
    """The outbox in memory, for one sink, on a clock the test moves."""

    owed: list[Owed] = field(default_factory=list)
    now: float = 0.0
    delays: list[tuple[int, float]] = field(default_factory=list)
    registered: list[str] = field(default_factory=list)
    others: list[SinkStats] = field(default_factory=list)
    # Per claim, whether it asked for the events packed.
    packed: list[bool] = field(default_factory=list)
    # What the relay asked, in order: "due" (the probe) or "claim".
    asked: list[str] = field(default_factory=list)

    async def register(self, sink: str) -> None:
        self.registered.append(sink)

    async def due(self, sink: str) -> bool:
        """Anything not dead and due now, whatever its order's lower versions."""
        self.asked.append("due")
        return any(not o.dead and o.due_at <= self.now for o in self.owed)

    @asynccontextmanager
    async def claim(self, sink: str, limit: int, *, packed: bool) -> AsyncIterator[FakeClaim]:
        """Due now, oldest due first, of each order its lowest owed version."""
        self.packed.append(packed)
        self.asked.append("claim")
        lowest: dict[str, int] = {}
        for o in self.owed:
            lowest[o.event.order_id] = min(o.event.version, lowest.get(o.event.order_id, 1 << 30))
        due = [
            o
            for o in sorted(self.owed, key=lambda o: (o.due_at, o.event.seq))
            if not o.dead and o.due_at <= self.now and lowest[o.event.order_id] == o.event.version
        ]
        yield FakeClaim(self, due[:limit])

    async def dead_letter(self, sink: str, max_age_s: float) -> int:
        """Every event owed longer than ``max_age_s`` (by its occurred_at) is dead."""
        dead = 0
        for o in self.owed:
            age = (START + timedelta(seconds=self.now) - o.event.occurred_at).total_seconds()
            if not o.dead and age > max_age_s:
                o.dead, dead = True, dead + 1
        return dead

    async def stats(self) -> list[SinkStats]:
        live = sum(not o.dead for o in self.owed)
        return [SinkStats("stream", live, len(self.owed) - live, 0.0), *self.others]


@dataclass
class FakeSink:
    """A sink that takes what ``refuse`` lets through, and remembers the order."""

    refuse: Callable[[OrderEvent, int], str | None] = lambda event, attempt: None
    name: SinkName = SinkName.STREAM
    max_age_s: float | None = None
    packed: bool = False
    taken: list[OrderEvent] = field(default_factory=list)
    tries: dict[int, int] = field(default_factory=dict)

    async def deliver(self, events: Sequence[OrderEvent]) -> list[str | None]:
        answers: list[str | None] = []
        for event in events:
            attempt = self.tries[event.seq] = self.tries.get(event.seq, 0) + 1
            why = self.refuse(event, attempt)
            if why is None:
                self.taken.append(event)
            answers.append(why)
        return answers


def event(seq: int, order: str, version: int, age_s: float = 0.0) -> OrderEvent:
    """Version ``version`` of ``order``, written ``age_s`` before the clock's start."""
    return OrderEvent.of(
        seq,
        event_id=f"e{seq}",
        type=EventType.ORDER_PAID,
        order_id=order,
        request_id=f"r-{order}",
        sku="sku",
        user_id=f"u-{order}",
        qty=1,
        status=OrderStatus.PAID,
        version=version,
        occurred_at=START - timedelta(seconds=age_s),
    )


def relay_of(outbox: FakeOutbox, sink: FakeSink, batch: int = 10) -> Relay:
    """A relay of ``sink`` over ``outbox``, with the backoff of these tests."""
    return Relay(
        outbox=outbox, sinks=[sink], observer=Observed(), batch=batch, poll_s=0.1, backoff=BACKOFF
    )


async def drain(relay: Relay, outbox: FakeOutbox, sink: FakeSink, passes: int = 50) -> None:
    """Pass after pass, the clock moved to the next due event when nothing is
    due now, until nothing is owed (at most ``passes``)."""
    for _ in range(passes):
        if not outbox.owed:
            return
        if await relay.relay_once(sink) == 0:
            outbox.now = min(o.due_at for o in outbox.owed if o.due_at > outbox.now)
    raise AssertionError(f"still owed after {passes} passes: {outbox.owed}")


class TestOrder:
    """Each order's versions reach the sink in order, whatever it refuses."""

    async def test_a_refused_version_holds_back_its_order_alone(self) -> None:
        """Three orders of three versions; the sink refuses A's version 1 twice:
        A's versions still arrive 1, 2, 3, and B's and C's all arrive before
        A's first, not held behind it."""
        outbox = FakeOutbox()
        seq = 0
        for version in (1, 2, 3):
            for order in ("A", "B", "C"):
                seq += 1
                outbox.owed.append(Owed(event(seq, order, version)))
        sink = FakeSink(
            refuse=lambda e, attempt: (
                "503" if (e.order_id, e.version) == ("A", 1) and attempt <= 2 else None
            )
        )
        await drain(relay_of(outbox, sink), outbox, sink)
        by_order = {
            order: [e.version for e in sink.taken if e.order_id == order] for order in "ABC"
        }
        assert by_order == {"A": [1, 2, 3], "B": [1, 2, 3], "C": [1, 2, 3]}
        first_of_a = next(i for i, e in enumerate(sink.taken) if e.order_id == "A")
        assert {e.order_id for e in sink.taken[:first_of_a]} == {"B", "C"}
        assert first_of_a == 6

    async def test_a_batch_takes_one_version_of_each_order(self) -> None:
        """One pass hands the sink at most one version of an order."""
        outbox = FakeOutbox(owed=[Owed(event(s, "A", s)) for s in (1, 2, 3)])
        sink = FakeSink()
        assert await relay_of(outbox, sink).relay_once(sink) == 1
        assert [e.version for e in sink.taken] == [1]

    @pytest.mark.parametrize("packed", [True, False])
    async def test_a_claim_asks_for_the_events_as_the_sink_takes_them(self, packed: bool) -> None:
        """A sink that takes events packed (the stream on one Redis) gets its
        claims packed; the others' claims come as fields."""
        outbox = FakeOutbox(owed=[Owed(event(1, "A", 1))])
        sink = FakeSink(packed=packed)
        await relay_of(outbox, sink).relay_once(sink)
        assert outbox.packed == [packed]


class TestBackoff:
    """A refused event is tried again after a pause that grows with its failures."""

    async def test_each_refusal_waits_longer(self) -> None:
        """An event refused four times: the delays are the backoff's, by the
        failures so far (1, 2, 4, 8 s), and it is not tried before each is
        over; then it is delivered."""
        outbox = FakeOutbox(owed=[Owed(event(1, "A", 1))])
        sink = FakeSink(refuse=lambda e, attempt: "timeout" if attempt <= 4 else None)
        relay = relay_of(outbox, sink)
        for failures in range(4):
            assert await relay.relay_once(sink) == 1
            _, delay = outbox.delays[-1]
            assert delay == pause(BACKOFF, failures)
            outbox.now += delay / 2
            assert await relay.relay_once(sink) == 0, "tried before its pause was over"
            outbox.now += delay / 2
        assert [d for _, d in outbox.delays] == [1.0, 2.0, 4.0, 8.0]
        assert await relay.relay_once(sink) == 1 and [e.seq for e in sink.taken] == [1]


class TestUpkeep:
    """Dead letters, and the backlog each pass samples."""

    @pytest.mark.parametrize("max_age_s", [None, 60.0])
    async def test_a_sink_with_a_max_age_dead_letters_what_is_older(
        self, max_age_s: float | None
    ) -> None:
        """Two events, one owed for two minutes: with a 60 s max age it is a dead
        letter (logged at error level), no longer tried, the other delivered;
        without a max age nothing is."""
        outbox = FakeOutbox(owed=[Owed(event(1, "A", 1, age_s=120)), Owed(event(2, "B", 1))])
        sink = FakeSink(max_age_s=max_age_s)
        relay = relay_of(outbox, sink)
        with capture_logs() as logs:
            await relay.upkeep()
        dead = [e for e in logs if e["event"] == "events_dead_lettered"]
        await relay.relay_once(sink)
        if max_age_s is None:
            assert not dead and [e.seq for e in sink.taken] == [1, 2]
        else:
            assert dead == [
                {
                    "event": "events_dead_lettered",
                    "sink": "stream",
                    "count": 1,
                    "log_level": "error",
                }
            ]
            assert [e.seq for e in sink.taken] == [2]
            assert await outbox.stats() == [SinkStats("stream", 0, 1, 0.0)]

    async def test_a_sink_nobody_serves_is_named_when_owed(self) -> None:
        """Registering warns once about a registered sink this relay does not
        serve that is still owed events, with the count; none about an empty one."""
        outbox = FakeOutbox(others=[SinkStats("webhook", 3, 1, 5.0), SinkStats("amqp", 0, 0, 0.0)])
        sink = FakeSink()
        with capture_logs() as logs:
            await relay_of(outbox, sink).register()
        assert outbox.registered == ["stream"]
        warned = [e for e in logs if e["event"] == "events_owed_to_unconfigured_sink"]
        assert [(e["sink"], e["owed"]) for e in warned] == [("webhook", 4)]


class LostOnCancel(FakeOutbox):
    """An outbox whose claim's transaction fails to end when the relay is
    cancelled mid-delivery (its connection gone with the shutdown): the error
    takes the cancellation's place, as an ``async with`` whose exit raises does."""

    @asynccontextmanager
    async def claim(self, sink: str, limit: int, *, packed: bool) -> AsyncIterator[FakeClaim]:
        async with super().claim(sink, limit, packed=packed) as claim:
            try:
                yield claim
            except asyncio.CancelledError:
                raise Unavailable("the connection went with the shutdown") from None


@dataclass
class Stalling(FakeSink):
    """A sink that never answers, its deliveries counted."""

    calls: int = 0

    async def deliver(self, events: Sequence[OrderEvent]) -> list[str | None]:
        self.calls += 1
        await asyncio.Event().wait()
        return []


@dataclass
class Swallowing(FakeSink):
    """A sink whose delivery swallows the cancel that lands in it and answers
    delivered, as redis-py's send does on Python 3.11: it goes through
    asyncio.wait_for, which returns the finished send's result and drops a
    cancel landing in the same turn (gateway.lock.tasks.rest)."""

    calls: int = 0

    async def deliver(self, events: Sequence[OrderEvent]) -> list[str | None]:
        self.calls += 1
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        return [None] * len(events)


class TestIdle:
    """An idle relay asks whether anything is due before it claims."""

    async def test_an_idle_relays_passes_are_probes_until_something_is_due(self) -> None:
        """Nothing owed: pass after pass asks the outbox whether anything is due,
        and claims nothing (an empty claim is a transaction: three round trips).
        Five events owed, in claims of 2: one probe, then a claim a pass while
        the last one took something (2, 2, 1, then none), and probes again."""
        outbox, sink = FakeOutbox(), FakeSink()
        relay = Relay(
            outbox=outbox, sinks=[sink], observer=Observed(), batch=2, poll_s=0.001, backoff=BACKOFF
        )
        task = asyncio.create_task(relay.run())
        try:
            await wait_for(lambda: len(outbox.asked) >= 3, what="three idle passes")
            assert set(outbox.asked) == {"due"}, "an idle relay claimed"
            idle = len(outbox.asked)
            outbox.owed = [Owed(event(seq, f"o{seq}", 1)) for seq in range(1, 6)]
            await wait_for(
                lambda: "due" in outbox.asked[idle + 1 :], what="a probe after the claims"
            )
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert [e.seq for e in sink.taken] == [1, 2, 3, 4, 5]
        after = outbox.asked[idle:]
        start = after.index("claim")
        assert set(after[:start]) == {"due"}
        assert after[start : start + 5] == ["claim"] * 4 + ["due"], (
            "a claim of nothing, or a probe too many"
        )


class TestStopping:
    """A relay stops when cancelled."""

    async def test_a_relay_stops_though_its_sink_swallowed_the_cancel(self) -> None:
        """The delivery ends as if nothing happened; the relay's next pass must
        not start: its task ends cancelled (it polled on for good, and a
        gateway's stop waited it out and logged it stuck)."""
        outbox = FakeOutbox(owed=[Owed(event(1, "A", 1))])
        sink = Swallowing()
        task = asyncio.create_task(relay_of(outbox, sink).run())
        await wait_for(lambda: sink.calls == 1, within=5, what="the first delivery")
        claims = len(outbox.packed)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done and task.cancelled(), "the relay went on after its cancel"
        assert len(outbox.packed) == claims, "a pass started after the cancel"

    async def test_a_relay_cancelled_mid_delivery_stops_though_its_claim_fails(self) -> None:
        """Cancelled while the sink holds a claim whose transaction then fails
        to end: the relay's task ends cancelled, and no claim is tried again
        (it took the failure for an outage, and retried forever)."""
        outbox = LostOnCancel(owed=[Owed(event(1, "A", 1))])
        sink = Stalling()
        task = asyncio.create_task(relay_of(outbox, sink).run())
        await wait_for(lambda: sink.calls == 1, within=5, what="the first delivery")
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done and task.cancelled(), "the relay went on after its cancel"
        assert sink.calls == 1
