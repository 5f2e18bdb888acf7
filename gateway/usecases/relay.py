"""The relay: every order event handed to every sink, at least once, each order's
versions in order.

Each gateway runs :meth:`Relay.run`, no leader: one loop per sink claims a
batch of the events due for it (``gateway.postgres.outbox``: ``FOR UPDATE
SKIP LOCKED``, so the relays of several gateways share the work and none
sends what another claimed), delivers it, and records the outcome in the same
transaction: delivered events are no longer owed to the sink, the others are
tried again after a backoff (:data:`DELIVERY_BACKOFF`). A gateway killed
mid-batch leaves the batch due again; the sink gets the same events, with
the same ``event_id``, from whichever relay claims them next. A claim takes
of each order only its lowest owed version, so version n+1 is never sent
before n was delivered, and different orders do not wait for each other.

A loop idle (nothing due) looks again after ``GATEWAY_EVENTS_POLL_S``, a poll
rather than a NOTIFY from the trigger: a NOTIFY takes a database-wide lock at
every flush's commit. PostgreSQL down, the loop logs and backs off
(:data:`OUTAGE_BACKOFF`); it never ends but by cancellation. Beside them one
upkeep loop dead-letters what a sink with a max age was owed too long, and
samples each sink's backlog for the metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import structlog
from redis.backoff import AbstractBackoff, EqualJitterBackoff, ExponentialBackoff

from gateway.domain.errors import Unavailable
from gateway.domain.events import EventSink, SinkStats
from gateway.lock.backoff import DOUBLINGS, pause
from gateway.lock.tasks import rest, stop_if_cancelled
from gateway.usecases.ports import Claimed, Deliveries

log = structlog.get_logger(__name__)

# An event a sink refused is tried again after 1 s, doubling to 10 minutes,
# each pause between half and all of that (equal jitter: the retries of a
# batch that failed together spread out, and none comes back at once).
DELIVERY_BACKOFF = EqualJitterBackoff(cap=600.0, base=1.0)
# A loop whose pass failed (PostgreSQL down) looks again after 0.1 s, doubling to 5 s.
OUTAGE_BACKOFF = ExponentialBackoff(cap=5.0, base=0.1)
# How often the upkeep dead-letters and samples.
UPKEEP_S = 1.0


class RelayObserver(Protocol):
    """What the relay reports (gateway.ops.event_metrics)."""

    def delivered(self, sink: str, lags_s: Sequence[float]) -> None:
        """Events delivered to ``sink``, each ``lag`` after it occurred."""

    def failed(self, sink: str, count: int) -> None:
        """``count`` attempts ``sink`` refused, to be tried again."""

    def sample(self, stats: Sequence[SinkStats]) -> None:
        """Each sink's backlog now."""


class Relay:
    """Hands the outbox's events to the sinks (see the module's docstring).

    Args:
        outbox: the outbox's deliveries.
        sinks: where events go; each has a name registered in the outbox.
        observer: the metrics.
        batch: events per claim (``GATEWAY_EVENTS_BATCH``).
        poll_s: the pause of a loop that found nothing due (``GATEWAY_EVENTS_POLL_S``).
        backoff: the pause before an event a sink refused is tried again, by
            its failures so far (:data:`DELIVERY_BACKOFF`).
    """

    def __init__(
        self,
        *,
        outbox: Deliveries,
        sinks: Sequence[EventSink],
        observer: RelayObserver,
        batch: int,
        poll_s: float,
        backoff: AbstractBackoff = DELIVERY_BACKOFF,
    ) -> None:
        self._outbox = outbox
        self._sinks = list(sinks)
        self._observer = observer
        self._batch = batch
        self._poll_s = poll_s
        self._backoff = backoff

    async def register(self) -> None:
        """Owe every sink of this relay the events written from now on; one
        warning per registered sink this relay does not serve that is still
        owed events (``events_owed_to_unconfigured_sink``, with the count)."""
        for sink in self._sinks:
            await self._outbox.register(sink.name)
        # A sink left out of the configuration stays registered and keeps being
        # owed every event: its backlog grows unseen unless someone says so.
        served = {sink.name for sink in self._sinks}
        for stats in await self._outbox.stats():
            owed = stats.depth + stats.dead
            if stats.sink not in served and owed:
                log.warning(
                    "events_owed_to_unconfigured_sink",
                    sink=stats.sink,
                    owed=owed,
                    hint=f"flashsale-gateway events --drop-sink {stats.sink} forgets them",
                )

    async def run(self) -> None:
        """Relay to every sink and keep up the outbox until cancelled."""
        async with asyncio.TaskGroup() as tasks:
            for sink in self._sinks:
                tasks.create_task(self._loop(sink), name=f"relay-{sink.name}")
            tasks.create_task(self._upkeep(), name="relay-upkeep")

    async def relay_once(self, sink: EventSink, *, probe: bool = False) -> int:
        """One pass for ``sink``: claim a batch, deliver it, record what the sink
        took; returns how many events it claimed. With ``probe`` (the last pass
        took nothing), a claim is made only once the outbox says something may
        be due: an idle relay's pass is one round trip, not a claim's
        transaction. Raises PostgresUnavailable."""
        if probe and not await self._outbox.due(sink.name):
            return 0
        async with self._outbox.claim(sink.name, self._batch, packed=sink.packed) as claim:
            if not claim.events:
                return 0
            answers = await sink.deliver(claim.events)
            await self._record(sink, claim, answers)
            return len(claim.events)

    async def _record(self, sink: EventSink, claim: Claimed, answers: Sequence[str | None]) -> None:
        """Record what ``sink`` took and what it refused (retried after a backoff)."""
        delivered: list[int] = []
        failed: list[tuple[int, float, str]] = []
        for event, attempts, why in zip(claim.events, claim.attempts, answers, strict=True):
            if why is None:
                delivered.append(event.seq)
            else:
                delay = pause(self._backoff, attempts)
                failed.append((event.seq, delay, why))
        lags = await claim.record(delivered, failed)
        self._observer.delivered(sink.name, lags)
        if failed:
            self._observer.failed(sink.name, len(failed))
            log.warning("events_not_delivered", sink=sink.name, count=len(failed), why=failed[0][2])

    async def _loop(self, sink: EventSink) -> None:
        """Pass after pass for ``sink``: at once while batches come full, after
        the poll interval when idle, after a growing pause while failing."""
        failures = 0
        claimed = 0
        while True:
            try:
                claimed = await self.relay_once(sink, probe=claimed == 0)
                failures = 0
            except Unavailable as exc:
                stop_if_cancelled(exc)
                log.warning("relay_failed", sink=sink.name, error=str(exc))
                await rest(pause(OUTAGE_BACKOFF, failures))
                failures += 1
                continue
            except Exception as exc:
                stop_if_cancelled(exc)
                log.exception("relay_failed", sink=sink.name)
                await rest(pause(OUTAGE_BACKOFF, DOUBLINGS))
                continue
            await rest(0 if claimed >= self._batch else self._poll_s)

    async def upkeep(self) -> None:
        """Dead-letter what each sink with a max age was owed longer, then
        sample every sink's backlog."""
        for sink in self._sinks:
            if sink.max_age_s is not None:
                dead = await self._outbox.dead_letter(sink.name, sink.max_age_s)
                if dead:
                    log.error("events_dead_lettered", sink=sink.name, count=dead)
        self._observer.sample(await self._outbox.stats())

    async def _upkeep(self) -> None:
        while True:
            try:
                await self.upkeep()
            except Unavailable as exc:
                stop_if_cancelled(exc)
                log.warning("relay_upkeep_failed", error=str(exc))
            except Exception as exc:
                stop_if_cancelled(exc)
                log.exception("relay_upkeep_failed")
            await rest(UPKEEP_S)
