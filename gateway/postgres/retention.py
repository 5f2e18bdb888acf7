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

from gateway.postgres.database import as_unavailable

# A bucket past its expiry is full again: the same as no row (sql/functions/sale_gate.sql).
PRUNE_RATE_BUCKETS = "DELETE FROM rate_buckets WHERE expires_at < now()"
# A release stops a flush that still carries the reservation it names. Such a
# flush was on its way when the release was made, and one that waited past the
# retention on top of the reservation timeout is left to the floor (the stock
# guard and the unique constraints of flush_batch()).
PRUNE_RELEASED = """
DELETE FROM released_reservations WHERE released_at < now() - make_interval(secs => $1)
"""


class Pruned(NamedTuple):
    """The rows one pass deleted, by table."""

    rate_buckets: int
    released_reservations: int


def _count(status: str) -> int:
    """The row count of a ``DELETE n`` command status."""
    return int(status.split()[-1])


class Retention:
    """Deletes what the tables written by traffic no longer need.

    Args:
        pool: the gateway's pool.
        release_retention_s: how long a release is kept after it was made
            (``GATEWAY_RELEASE_RETENTION_S``).
    """

    def __init__(self, pool: asyncpg.Pool, release_retention_s: float) -> None:
        self._pool = pool
        self._release_retention_s = release_retention_s

    async def prune(self) -> Pruned:
        """One pass over every table with a retention; what it deleted."""
        with as_unavailable:
            async with self._pool.acquire() as con:
                buckets = await con.execute(PRUNE_RATE_BUCKETS)
                released = await con.execute(PRUNE_RELEASED, self._release_retention_s)
        return Pruned(_count(buckets), _count(released))
