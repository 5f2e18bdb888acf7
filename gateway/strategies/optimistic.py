"""``optimistic``: read stock and version, then an UPDATE conditional on both.

A purchase whose UPDATE finds another version lost a race to a concurrent one:
nothing was written, and it tries again in a new transaction (never inside the
old one, which under repeatable read would reread the same stale version
forever), after a pause drawn at random up to a ceiling that doubles each time
("full jitter"), within a budget of attempts. When the budget is spent it is
answered 503 with ``Retry-After``: a busy answer, never a false 201. The
UPDATE keeps ``stock >= $2`` beside the version check, so a read that is stale
in any other way cannot oversell either.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from redis.backoff import FullJitterBackoff

from gateway.domain.errors import Contended
from gateway.domain.model import Purchase, Result
from gateway.lock.backoff import pause
from gateway.postgres.database import Connection
from gateway.settings import Settings
from gateway.strategies.rows import Rows

READ_VERSION = "SELECT stock, version FROM inventory WHERE sku = $1"
TAKE_STOCK_AT_VERSION = """
UPDATE inventory SET stock = stock - $2, version = version + 1, updated_at = now()
WHERE sku = $1 AND version = $3 AND stock >= $2 RETURNING stock
"""


class OptimisticObserver(Protocol):
    """What the metrics want to know of the optimistic strategy (gateway.ops.metrics)."""

    def optimistic_conflict(self) -> None: ...
    def optimistic_retry(self) -> None: ...
    def optimistic_exhausted(self) -> None: ...


class VersionConflict(Exception):
    """The row's version moved between the read and the UPDATE."""


async def take_at_version(con: Connection, purchase: Purchase) -> bool:
    """Take the units at the version just read; raises :class:`VersionConflict`."""
    row = await con.fetchrow(READ_VERSION, purchase.sku)
    if row is None or row["stock"] < purchase.qty:
        return False
    args = (purchase.sku, purchase.qty, row["version"])
    if await con.fetchval(TAKE_STOCK_AT_VERSION, *args) is None:
        raise VersionConflict()
    return True


class Optimistic:
    """The ``optimistic`` strategy."""

    def __init__(
        self, rows: Rows, settings: Settings, observer: OptimisticObserver | None = None
    ) -> None:
        self._rows = rows
        self._attempts = settings.optimistic_attempts
        # Not a secret: jitter only spreads the retries of a crowd apart.
        self._backoff = FullJitterBackoff(
            cap=settings.optimistic_backoff_max_ms / 1000,
            base=settings.optimistic_backoff_ms / 1000,
        )
        self._observer = observer

    async def purchase(self, purchase: Purchase) -> Result:
        """Decide one purchase, retrying lost races; raises :class:`Contended`
        when every attempt of the budget lost one."""
        for attempt in range(self._attempts):
            if attempt:
                await asyncio.sleep(pause(self._backoff, attempt - 1))
                if self._observer is not None:
                    self._observer.optimistic_retry()
            try:
                return await self._rows.decide(purchase, take_at_version)
            except VersionConflict:
                if self._observer is not None:
                    self._observer.optimistic_conflict()
        if self._observer is not None:
            self._observer.optimistic_exhausted()
        raise Contended(f"lost {self._attempts} races for the stock; retry")
