"""The outbox in PostgreSQL: each sink's owed events claimed, recorded, dead-lettered,
redelivered, dropped and listed (``sql/010_order_events.sql``, ``sql/011_event_delivery.sql``).

A claim keeps its rows, ``FOR UPDATE SKIP LOCKED``, in a transaction that lasts
while the relay delivers them and ends with the record of what the sink took:
another relay
skips them, and a relay that dies mid-delivery (SIGKILL, PostgreSQL restarted)
leaves its transaction to roll back, so the rows are due again at once, with
no lease to wait out and no clock to trust. It costs a pool connection per
sink while a batch is out (a webhook's timeout at worst). A claim takes, of
each order, only its lowest version still owed to the sink: version n+1 waits
until n is delivered (or stays behind it while n is a dead letter). Driver
errors become :class:`gateway.domain.errors.PostgresUnavailable`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from gateway.domain.events import OrderEvent, SinkStats
from gateway.postgres.database import Connection, as_unavailable

REGISTER = "INSERT INTO event_sinks (name) VALUES ($1) ON CONFLICT DO NOTHING"
# Up to $2 events due for sink $1, locked until the claim's transaction ends
# (sql/functions/claim_events.sql): seq, fields or with $3 packed, attempts,
# fresh, and each event's age in seconds by PostgreSQL's clock once the claim
# is made (the function has returned every row when the outer SELECT reads
# the clock): the delivery lag is that age plus the delivery's own time, so
# the record needs no round trip to read the clock again.
CLAIM = """
SELECT seq, fields, packed, attempts, fresh,
    extract(epoch FROM clock_timestamp())::float8 - occurred
FROM claim_events($1, $2, $3)
"""
# Whether sink $1 may be owed anything due now: what a claim would look at,
# without its order rules (a later version waiting behind an earlier one still
# says yes, and its claim then takes nothing). A relay that found nothing asks
# this first: one round trip out of a transaction, where an empty claim took
# three and a call of claim_events (docs/performance.md, "An idle relay").
DUE = """
SELECT EXISTS (
        SELECT 1 FROM event_deliveries
        WHERE sink = $1 AND dead_at IS NULL AND due_at <= now())
    OR EXISTS (
        SELECT 1 FROM event_batches
        WHERE sink = $1 AND (claimable_at IS NULL OR claimable_at <= now()))
"""
# Flushes ($2, their tokens) that handed their new orders' first events to
# sink $1 themselves (sql/032_event_handoff.sql): their batch rows go. A
# token whose row a relay already took, after the grace, deletes nothing.
HANDED_OFF = "DELETE FROM event_batches WHERE sink = $1 AND handoff = ANY($2::bigint[])"
# A batch's events a sink refused: owed one by one from now on, since their
# write (the max age counts from there, as for any event). Each read by its own
# probe (OFFSET 0: a join hashed the whole order_events; sql/functions/claim_events.sql).
REFUSED_FROM_BATCH = """
INSERT INTO event_deliveries
    (sink, seq, order_id, version, occurred_at, owed_since, attempts, due_at, last_error)
SELECT $1, e.seq, e.order_id, e.version, e.occurred_at, e.occurred_at, 1,
    now() + make_interval(secs => f.delay), f.error
FROM unnest($2::bigint[], $3::float8[], $4::text[]) AS f(seq, delay, error)
CROSS JOIN LATERAL (SELECT * FROM order_events o WHERE o.seq = f.seq OFFSET 0) e
"""
# The events owed one by one ($2) delivered: forgotten. Those of a batch went
# with its row, deleted by the claim: a sale's claims, all batches, make no
# round trip here.
DELIVERED = "DELETE FROM event_deliveries WHERE sink = $1 AND seq = ANY($2::bigint[])"
FAILED = """
UPDATE event_deliveries d SET attempts = d.attempts + 1, last_error = f.error,
    due_at = now() + make_interval(secs => f.delay)
FROM unnest($2::bigint[], $3::float8[], $4::text[]) AS f(seq, delay, error)
WHERE d.sink = $1 AND d.seq = f.seq
"""
DEAD_LETTER = """
UPDATE event_deliveries SET dead_at = now()
WHERE sink = $1 AND seq IN (
    SELECT seq FROM event_deliveries
    WHERE sink = $1 AND dead_at IS NULL AND owed_since < now() - make_interval(secs => $2)
    FOR UPDATE SKIP LOCKED)
"""
# A redelivery (``events --redeliver``, ``--redeliver-since``): each event named
# becomes owed again to each sink named (one, or every registered one), due
# at once, delivered or not, never tried, its max age counted anew. An event
# still in one of the sink's batches is due anyway and left there, so no
# event is owed twice to one sink. Per-order order is kept as for any owed
# event: a version waits while a lower one is owed.
REDELIVERY = """
WITH target AS (SELECT name FROM event_sinks WHERE $1::text IS NULL OR name = $1),
picked AS (
    SELECT t.name AS sink, e.seq, e.order_id, e.version, e.occurred_at
    FROM ({events}) e CROSS JOIN target t
),
batched AS (
    SELECT b.sink, u.seq FROM event_batches b CROSS JOIN LATERAL unnest(b.seqs) AS u(seq)
    WHERE b.sink IN (SELECT name FROM target)
),
owed AS (
    INSERT INTO event_deliveries AS d (sink, seq, order_id, version, occurred_at)
    SELECT p.sink, p.seq, p.order_id, p.version, p.occurred_at FROM picked p
    WHERE NOT EXISTS (SELECT 1 FROM batched b WHERE b.sink = p.sink AND b.seq = p.seq)
    ON CONFLICT (sink, seq) DO UPDATE
    SET dead_at = NULL, due_at = now(), owed_since = now(), attempts = 0
    RETURNING 1
)
SELECT (SELECT count(*) FROM owed) + (SELECT count(*) FROM picked p
    WHERE EXISTS (SELECT 1 FROM batched b WHERE b.sink = p.sink AND b.seq = p.seq))
"""
# One event, with its order's earlier dead letters for the same sinks: those
# must be delivered first, and a dead letter is never tried by itself.
REDELIVER_ONE = REDELIVERY.format(
    events="SELECT seq, order_id, version, occurred_at FROM order_events WHERE event_id = $2::uuid"
)
REVIVE_EARLIER = """
UPDATE event_deliveries d SET dead_at = NULL, due_at = now(), owed_since = now(), attempts = 0
FROM order_events e
WHERE e.event_id = $2::uuid AND d.order_id = e.order_id AND d.version < e.version
    AND d.dead_at IS NOT NULL AND ($1::text IS NULL OR d.sink = $1)
"""
REDELIVER_SINCE = REDELIVERY.format(
    events="SELECT seq, order_id, version, occurred_at FROM order_events WHERE occurred_at >= $2"
)
# A sink forgotten: what it is owed, then its registration (issue 40.6).
DROP_SINK = """
WITH batches AS (DELETE FROM event_batches WHERE sink = $1 RETURNING cardinality(seqs) AS n),
deliveries AS (DELETE FROM event_deliveries WHERE sink = $1 RETURNING 1),
sinks AS (DELETE FROM event_sinks WHERE name = $1 RETURNING 1)
SELECT (SELECT count(*) FROM sinks),
    (SELECT COALESCE(sum(n), 0) FROM batches) + (SELECT count(*) FROM deliveries)
"""
SINKS = "SELECT name FROM event_sinks ORDER BY name"
OWED = """
SELECT d.sink, e.event_id::text, e.type, e.order_id::text, e.version, d.attempts,
    d.last_error, d.dead_at IS NOT NULL AS dead,
    EXTRACT(EPOCH FROM now() - e.occurred_at)::float8 AS age_s
FROM events_owed d JOIN order_events e ON e.seq = d.seq
ORDER BY d.sink, d.seq LIMIT $1
"""
# Not through events_owed: that view joins every owed seq to its event, and
# the upkeep samples it each second, so a backlog of 40,000 events cost 100 ms
# a sample. A batch's events share one occurred_at (their statement's now()),
# so each batch's first event stands for all of them; one index probe a batch
# (OFFSET 0 keeps the planner from hashing the whole order_events instead).
STATS = """
WITH owed AS (
    SELECT d.sink, count(*) FILTER (WHERE d.dead_at IS NULL) AS depth,
        count(*) FILTER (WHERE d.dead_at IS NOT NULL) AS dead,
        min(d.occurred_at) FILTER (WHERE d.dead_at IS NULL) AS oldest
    FROM event_deliveries d GROUP BY d.sink
    UNION ALL
    SELECT b.sink, sum(cardinality(b.seqs)), 0, min(e.occurred_at)
    FROM event_batches b
    CROSS JOIN LATERAL (
        SELECT o.occurred_at FROM order_events o WHERE o.seq = b.first_seq OFFSET 0) e
    GROUP BY b.sink
)
SELECT s.name, COALESCE(sum(o.depth), 0)::bigint AS depth, COALESCE(sum(o.dead), 0)::bigint AS dead,
    COALESCE(EXTRACT(EPOCH FROM now() - min(o.oldest)), 0)::float8 AS oldest_s
FROM event_sinks s LEFT JOIN owed o ON o.sink = s.name
GROUP BY s.name ORDER BY s.name
"""
# The oldest event owed to a sink, dead letters included, by the lowest seq:
# the order of writing, which is occurred_at's but for transactions open at
# once (a margin on the reader's side covers them).
OLDEST_OWED = """
SELECT least(
    (SELECT occurred_at FROM event_deliveries WHERE sink = $1 ORDER BY seq LIMIT 1),
    (SELECT e.occurred_at FROM event_batches b JOIN order_events e ON e.seq = b.first_seq
     WHERE b.sink = $1 ORDER BY b.first_seq LIMIT 1))
"""


@dataclass(frozen=True, slots=True)
class Owed:
    """An event owed to a sink, as ``flashsale-gateway events`` lists it."""

    sink: str
    event_id: str
    type: str
    order_id: str
    version: int
    attempts: int
    last_error: str | None
    dead: bool
    age_s: float


def _count(status: str) -> int:
    """The row count of an ``UPDATE n`` or ``DELETE n`` command status."""
    return int(status.split()[-1])


class Claim:
    """A batch of one sink's events, claimed until its outcome is recorded
    (:meth:`Outbox.claim`): those owed one by one, then those of batches
    (``fresh``, never tried; the last batch split when it did not fit)."""

    def __init__(self, con: Connection, sink: str, rows: Sequence[asyncpg.Record]) -> None:
        self._con, self._sink = con, sink
        self.events = [OrderEvent(r[0], r[1], r[2]) for r in rows]
        # Failed attempts so far, per event: what the next backoff grows from.
        self.attempts = [r[3] for r in rows]
        self._fresh = frozenset(r[0] for r in rows if r[4])
        # Each event's age when claimed (PostgreSQL's clock), and when that was
        # by this process's: a delivered event's lag is its age plus the time since.
        self._ages = {r[0]: r[5] for r in rows}
        self._claimed_at = time.monotonic()

    async def record(
        self, delivered: Sequence[int], failed: Sequence[tuple[int, float, str]]
    ) -> list[float]:
        """Forget the ``delivered`` seqs for this sink (those of a batch went
        with its row, deleted by the claim); try each ``failed`` (seq, delay in
        seconds, why) again after its delay. Returns the delivered events' lags
        (from occurred_at, PostgreSQL's clock, to now)."""
        with as_unavailable:
            lags: list[float] = []
            if delivered:
                waited = time.monotonic() - self._claimed_at
                ages = self._ages
                lags = [ages[seq] + waited for seq in delivered]
                owed = [seq for seq in delivered if seq not in self._fresh]
                if owed:
                    await self._con.execute(DELIVERED, self._sink, owed)
            await self._refused(failed)
        return lags

    async def _refused(self, failed: Sequence[tuple[int, float, str]]) -> None:
        """Record the refusals: a row per event owed one by one, a new one for
        an event of a batch."""
        again = [f for f in failed if f[0] not in self._fresh]
        first = [f for f in failed if f[0] in self._fresh]
        for query, rows in ((FAILED, again), (REFUSED_FROM_BATCH, first)):
            if rows:
                seqs, delays, errors = zip(*rows, strict=True)
                await self._con.execute(query, self._sink, seqs, delays, errors)


class Outbox:
    """The outbox's deliveries, for the relay and the ``events`` command."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def _execute(self, query: str, *args: Any) -> str:
        with as_unavailable:
            async with self._pool.acquire() as con:
                return str(await con.execute(query, *args))

    async def _fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        with as_unavailable:
            async with self._pool.acquire() as con:
                return list(await con.fetch(query, *args))

    async def register(self, sink: str) -> None:
        """Owe ``sink`` every event written from now on."""
        await self._execute(REGISTER, sink)

    @asynccontextmanager
    async def claim(self, sink: str, limit: int, *, packed: bool) -> AsyncIterator[Claim]:
        """Claim up to ``limit`` events due for ``sink`` (distinct orders) while
        the body delivers them and records the outcome; the rows go back to due if it
        raises or the gateway dies. With ``packed`` the events come packed for the
        stream (``OrderEvent.packed``), not as fields. Raises PostgresUnavailable."""
        with as_unavailable:
            async with self._pool.acquire() as con, con.transaction():
                yield Claim(con, sink, await con.fetch(CLAIM, sink, limit, packed))

    async def due(self, sink: str) -> bool:
        """Whether ``sink`` may be owed an event due now: never false when a
        claim would take one (it may be true when a claim takes nothing).
        Raises PostgresUnavailable."""
        with as_unavailable:
            async with self._pool.acquire() as con:
                return bool(await con.fetchval(DUE, sink))

    async def handed_off(self, sink: str, tokens: Sequence[int]) -> int:
        """The flushes of ``tokens`` handed their first events to ``sink``
        themselves: their batch rows go; how many. Raises PostgresUnavailable."""
        return _count(await self._execute(HANDED_OFF, sink, tokens))

    async def dead_letter(self, sink: str, max_age_s: float) -> int:
        """Dead-letter what ``sink`` was owed longer than ``max_age_s``; how many."""
        return _count(await self._execute(DEAD_LETTER, sink, max_age_s))

    async def sinks(self) -> list[str]:
        """The registered sinks' names, by name."""
        return [r["name"] for r in await self._fetch(SINKS)]

    async def redeliver(self, event_id: str, sink: str | None = None) -> int:
        """Owe one event again, due at once, to ``sink`` (else every registered
        sink), whether delivered or not, with its order's earlier dead letters
        for the same sinks; how many (event, sink) deliveries are now due (0:
        no such event, or it was pruned)."""
        with as_unavailable:
            async with self._pool.acquire() as con, con.transaction():
                await con.execute(REVIVE_EARLIER, sink, event_id)
                count: int = await con.fetchval(REDELIVER_ONE, sink, event_id)
        return count

    async def redeliver_since(self, since: datetime, sink: str | None = None) -> int:
        """Owe every event that occurred at or after ``since`` and is still in the
        outbox (``GATEWAY_EVENTS_RETENTION_S``) again, due at once, to ``sink``
        (else every registered sink), delivered or not; how many (event, sink)
        deliveries are now due."""
        with as_unavailable:
            async with self._pool.acquire() as con:
                count: int = await con.fetchval(REDELIVER_SINCE, sink, since)
        return count

    async def drop_sink(self, sink: str) -> tuple[bool, int]:
        """Forget ``sink``: every event owed to it, dead letters included, and
        its registration. Returns whether it was registered and how many owed
        events went."""
        with as_unavailable:
            async with self._pool.acquire() as con:
                row = await con.fetchrow(DROP_SINK, sink)
        assert row is not None
        return bool(row[0]), int(row[1])

    async def owed(self, limit: int) -> list[Owed]:
        """The events owed to a sink, undelivered or dead, by sink and age."""
        return [Owed(*r) for r in await self._fetch(OWED, limit)]

    async def stats(self) -> list[SinkStats]:
        """Each registered sink's backlog (gauges, sampled)."""
        return [SinkStats(*r) for r in await self._fetch(STATS)]

    async def oldest_owed(self, sink: str) -> datetime | None:
        """When the oldest event owed to ``sink`` occurred; None: nothing owed."""
        rows = await self._fetch(OLDEST_OWED, sink)
        return rows[0][0] if rows else None
