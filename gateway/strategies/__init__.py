"""The synchronous deduction strategies that decide in PostgreSQL alone.

``reserve-batch``, the default, is :mod:`gateway.usecases.purchases` itself: the Lua
reservation in Redis, then the batched, guarded flush. A sku may instead sell
under one of these, each deciding one purchase at a time with no Redis at all:

- ``sql-direct`` (:mod:`.sql_direct`): one transaction, the guarded UPDATE, then
  the INSERT;
- ``optimistic`` (:mod:`.optimistic`): an UPDATE conditional on the row's
  version, retried outside the transaction with jittered backoff;
- ``pessimistic`` (:mod:`.pessimistic`): ``SELECT ... FOR UPDATE``, then the
  guarded UPDATE and the INSERT.

All three share :mod:`.rows` (the replay and duplicate checks, the INSERT under
the unique constraints), so they answer exactly as the API always has.
"""

from __future__ import annotations

from typing import Protocol

from gateway.domain.model import Purchase, Result


class Deduction(Protocol):
    """A strategy :class:`gateway.usecases.purchases.Purchases` hands a sku's purchases to."""

    async def purchase(self, purchase: Purchase) -> Result:
        """Decide one purchase (it carries its request id); raises a
        :class:`gateway.domain.errors.GatewayError` for 4xx/503 answers."""
        ...
