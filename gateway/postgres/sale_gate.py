"""The sale window and rate buckets PostgreSQL keeps for the strategies without
Redis state: the only caller of ``sale_gate()`` (``sql/functions/sale_gate.sql``).

Which buckets apply to a purchase is the use case's to say
(``gateway.usecases.sale_gate``); here they are checked and taken by
PostgreSQL's clock in one round trip; ``gateway.postgres.retention`` prunes
the ones full again. Driver errors become
:class:`gateway.domain.errors.PostgresUnavailable`.
"""

from __future__ import annotations

import asyncpg

from gateway.domain.model import Purchase
from gateway.domain.rules import GATE_DECISIONS, Bucket, GateAnswer
from gateway.postgres.database import as_unavailable

# The window and rate limits of one purchase, in one round trip.
SALE_GATE = "SELECT verdict, wait_ms FROM sale_gate($1, $2, $3, $4, $5, $6, $7, $8, $9)"


_NO_BUCKET = Bucket("", 0.0, 0)


class PostgresSaleGate:
    """Calls ``sale_gate()`` for a purchase."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def check(
        self, purchase: Purchase, user: Bucket | None, client: Bucket | None
    ) -> GateAnswer:
        """The sale window and the token buckets of ``purchase`` by PostgreSQL's
        clock; a bucket of None is not checked."""
        p, u, c = purchase, user or _NO_BUCKET, client or _NO_BUCKET
        args = (p.sku, p.request_id, p.qty, u.name, u.per_s, u.burst, c.name, c.per_s, c.burst)
        with as_unavailable:
            row = await self._pool.fetchrow(SALE_GATE, *args)
        assert row is not None  # a function call returns its one row
        return GateAnswer(GATE_DECISIONS[row["verdict"]], row["wait_ms"])
