"""The hand-off: a flush's new orders' first events appended to the stream by
the flushing gateway, straight after the commit, with the outbox as the fallback
(issue 42; ``sql/032_event_handoff.sql``).

The relay reads every event back from the outbox, has PostgreSQL pack it and
hands it on: about 11 µs of the stack's CPU an event, most of a sale's cost
of its events (docs/performance.md, "The whole stack on one core"). A flush's
new orders are in the flushing gateway's hands when it commits, and their
first events are made of what it holds. So the flush asks ``flush_batch()`` to mark the stream's
batch row of them with a token and keep it from the relays for
:data:`GRACE_S`, and gives the orders here (:meth:`HandOff.give`). The loop
appends what was given since its last pass in one round trip; the rows of the
flushes whose every event was appended are deleted at most :data:`RECORD_S`
later, many in one statement.

Whatever goes wrong leaves the row owed, and a relay delivers it once the
grace is over, as any batch: a gateway killed between its commit and its
append, Redis refusing an append, PostgreSQL down when the hand-off is
recorded (then the events are appended twice, with one event_id each: the
first event's id is its order's). A later version of an order (a payment, a
cancel) waits while its first version's row is owed, so it never goes before
the first. A flush given more than :data:`STALE_S` ago is left to the relay:
an append that late could land after the relay delivered the row and a later
version, and the consumer would see the first version again after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

import structlog

from gateway.domain.errors import Unavailable
from gateway.domain.events import FirstEvents
from gateway.lock.tasks import rest, stop_if_cancelled
from gateway.usecases.ports import FirstEventsOut, HandOffRecords
from gateway.usecases.relay import RelayObserver

log = structlog.get_logger(__name__)

# How long a hand-off's batch row is kept from the relays after its commit:
# sql/032_event_handoff.sql's interval, in seconds.
GRACE_S = 5.0
# A flush given longer ago than this is not appended, but left to the relay.
STALE_S = GRACE_S / 2
# How long landed flushes wait to be recorded, so one statement records many
# (a statement a pass cost the stack 1.5 µs an order more, docs/performance.md);
# well within the grace, and a later version of their orders waits that long.
RECORD_S = 0.25
# How long a pass waits after the first flush given, for more to go with it: a
# pass a flush cost the stack 29.5 µs an order more than no events, 20 ms
# 16.6, 50 ms 16.5 (docs/performance.md, "The whole stack on one core").
PACE_S = 0.02


class HandOff:
    """Appends flushes' first events to ``sink`` (see the module's docstring).

    Args:
        sink: the sink's name (``stream``), which ``flush_batch()`` marks the
            batch rows of.
        out: appends the events.
        records: the outbox, told which flushes' events were appended.
        observer: the relay's metrics: a hand-off's events count as delivered.
        clock: monotonic seconds (tests give their own).
    """

    def __init__(
        self,
        *,
        sink: str,
        out: FirstEventsOut,
        records: HandOffRecords,
        observer: RelayObserver,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self._clock = clock
        self._out = out
        self._records = records
        self._observer = observer
        # What flushes gave since the last pass, with when (monotonic).
        self._given: list[tuple[float, FirstEvents]] = []
        # The tokens of flushes whose events landed and are not yet recorded,
        # with when they landed.
        self._landed: list[tuple[float, int]] = []
        self._woken = asyncio.Event()

    def give(self, flush: FirstEvents) -> None:
        """A committed flush's new orders: their first events are appended on
        the loop's next pass."""
        self._given.append((self._clock(), flush))
        self._woken.set()

    async def run(self) -> None:
        """Pass after pass, each once something was given, until cancelled;
        what landed is recorded at most :data:`RECORD_S` after it did."""
        while True:
            if self._landed:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RECORD_S):
                        await self._woken.wait()
            else:
                await self._woken.wait()
            try:
                if self._woken.is_set():
                    # What more flushes give meanwhile goes in the same pass.
                    await rest(PACE_S)
                    self._woken.clear()
                    await self.hand_off()
                if self._landed and self._clock() - self._landed[0][0] >= RECORD_S:
                    await self.record()
            except Exception as exc:
                stop_if_cancelled(exc)
                # What was taken is the relay's once the grace is over.
                log.exception("events_handoff_failed", sink=self.sink)

    async def finish(self, within: float) -> None:
        """Wait, at most ``within`` seconds, until everything given has been
        appended and recorded by the loop: a stopping gateway's last flushes
        reach the stream now, not a relay after the grace."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                while self._given or self._landed:
                    await rest(PACE_S)

    async def record(self) -> None:
        """Tell the outbox which flushes' events landed: their rows go."""
        landed, self._landed = self._landed, []
        if not landed:
            return
        try:
            await self._records.handed_off(self.sink, [token for _, token in landed])
        except Unavailable as exc:
            stop_if_cancelled(exc)
            # Appended all the same: the relay appends them again after the grace.
            log.warning("events_handoff_unrecorded", sink=self.sink, error=str(exc))

    async def hand_off(self) -> None:
        """Append what was given since the last pass; what landed waits for
        :meth:`record`."""
        given, self._given = self._given, []
        now = self._clock()
        fresh = [(at, flush) for at, flush in given if now - at < STALE_S]
        if len(fresh) < len(given):
            log.warning("events_handoff_late", sink=self.sink, flushes=len(given) - len(fresh))
        if not fresh:
            return
        appended = await self._out.hand_off([flush for _, flush in fresh])
        done = self._clock()
        landed = [(at, flush) for (at, flush), ok in zip(fresh, appended, strict=True) if ok]
        if len(landed) < len(fresh):
            log.warning("events_handoff_refused", sink=self.sink, flushes=len(fresh) - len(landed))
        self._landed += [(done, flush.token) for _, flush in landed]
        self._observer.delivered(self.sink, _lags(landed, done))


def _lags(landed: Sequence[tuple[float, FirstEvents]], done: float) -> list[float]:
    """Each landed event's lag: from its flush's commit to its append."""
    return [done - at for at, flush in landed for _ in flush.orders]
