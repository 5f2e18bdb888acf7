"""The PostgreSQL rows that can no longer matter, deleted: one pruning pass for
every table that is not the books (``docs/operations.md``, "What is kept").

``orders`` and ``stock_movements`` are the books and kept; ``inventory`` is the
catalog an admin writes; ``schema_migrations`` one row a migration. The rest
are written by traffic, and this pass bounds them. Driver errors become
:class:`gateway.domain.errors.PostgresUnavailable`.
"""

from __future__ import annotations

from typing import NamedTuple

import asyncpg

from gateway.postgres.database import Connection, as_unavailable

# A bucket past its expiry is full again: the same as no row (sql/functions/sale_gate.sql).
PRUNE_RATE_BUCKETS = "DELETE FROM rate_buckets WHERE expires_at < now()"
# A release stops a flush that still carries the reservation it names. Such a
# flush was on its way when the release was made, and one that waited past the
# retention on top of the reservation timeout is left to the floor (the stock
# guard and the unique constraints of flush_batch()).
PRUNE_RELEASED = """
DELETE FROM released_reservations WHERE released_at < now() - make_interval(secs => $1)
"""
# An event delivered to every sink it was owed to (no delivery row left, and
# older than every batch still owed, sql/011_event_delivery.sql) and older
# than GATEWAY_EVENTS_RETENTION_S: found by the BRIN index on occurred_at,
# deleted a bounded batch at a time.
PRUNE_EVENTS = """
DELETE FROM order_events WHERE seq IN (
    SELECT e.seq FROM order_events e
    WHERE e.occurred_at < now() - make_interval(secs => $1)
        AND e.seq < (SELECT COALESCE(min(first_seq), 'Infinity'::numeric) FROM event_batches)
        AND NOT EXISTS (SELECT 1 FROM event_deliveries d WHERE d.seq = e.seq)
    LIMIT $2)
"""
# Events one DELETE removes, and the most DELETEs of a pass: a pass stays
# short, and still keeps up with 20,000 events a second at a 5 s interval.
EVENTS_BATCH = 5_000
EVENTS_ROUNDS = 20


class Pruned(NamedTuple):
    """The rows one pass deleted, by table."""

    rate_buckets: int
    released_reservations: int
    order_events: int


def _count(status: str) -> int:
    """The row count of a ``DELETE n`` command status."""
    return int(status.split()[-1])


class Retention:
    """Deletes what the tables written by traffic no longer need.

    Args:
        pool: the gateway's pool.
        release_retention_s: how long a release is kept after it was made
            (``GATEWAY_RELEASE_RETENTION_S``).
        events_retention_s: how long a delivered event is kept after it
            occurred (``GATEWAY_EVENTS_RETENTION_S``).
    """

    def __init__(
        self, pool: asyncpg.Pool, release_retention_s: float, events_retention_s: float = 604_800.0
    ) -> None:
        self._pool = pool
        self._release_retention_s = release_retention_s
        self._events_retention_s = events_retention_s

    async def prune(self) -> Pruned:
        """One pass over every table with a retention; what it deleted."""
        with as_unavailable:
            async with self._pool.acquire() as con:
                buckets = await con.execute(PRUNE_RATE_BUCKETS)
                released = await con.execute(PRUNE_RELEASED, self._release_retention_s)
                events = await self._prune_events(con)
        return Pruned(_count(buckets), _count(released), events)

    async def _prune_events(self, con: Connection) -> int:
        """The outbox's delivered events past their retention, batch by batch."""
        pruned = 0
        for _ in range(EVENTS_ROUNDS):
            deleted = _count(
                await con.execute(PRUNE_EVENTS, self._events_retention_s, EVENTS_BATCH)
            )
            pruned += deleted
            if deleted < EVENTS_BATCH:
                break
        return pruned
