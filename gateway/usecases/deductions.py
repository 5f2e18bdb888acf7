"""The purchases of the strategies that decide in PostgreSQL alone.

A sku whose strategy does not reserve in Redis (``Strategy.reserves`` false:
``sql-direct``, ``pessimistic``, ``optimistic``) is handed here by
:class:`gateway.usecases.purchases.Purchases` right after the catalog.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from gateway.domain.errors import ShuttingDown, Unavailable
from gateway.domain.model import Purchase, Result, SkuInfo, Strategy
from gateway.strategies import Deduction
from gateway.usecases.ports import UNOBSERVED, Client, Draining, Gate, ShedObserver


class Deductions:
    """The purchases of the strategies that decide in PostgreSQL alone: the sale
    gate's window and rates, then the sku's :class:`Deduction`, at most
    ``limit`` in flight."""

    def __init__(
        self,
        strategies: Mapping[Strategy, Deduction],
        *,
        gate: Gate,
        draining: Draining,
        limit: int,
        observer: ShedObserver = UNOBSERVED,
    ) -> None:
        self._strategies = dict(strategies)
        self._gate = gate
        self._draining = draining
        # In flight (most of them queued for a pool connection), bounded as the
        # batcher's backlog is: beyond it a storm is shed with 503.
        self._in_flight = 0
        self._limit = limit
        self._observer = observer

    async def purchase(
        self,
        strategy: Strategy,
        purchase: Purchase,
        info: SkuInfo,
        client: Client,
    ) -> Result:
        """Decide ``purchase`` under ``strategy`` once its window and rate limits
        let it through; raises Unavailable when this gateway does not serve the
        strategy or is busy, ShuttingDown while draining, and whatever the gate
        and the strategy raise."""
        deduction = self._strategies.get(strategy)
        if deduction is None:
            raise Unavailable(f"strategy {strategy} is not served by this gateway")
        if self._draining.closing:
            raise ShuttingDown()
        if self._in_flight >= self._limit:
            self._observer.shed_one()
            raise Unavailable("gateway busy")
        purchase = purchase.identified()
        structlog.contextvars.bind_contextvars(request_id=purchase.request_id, sku=purchase.sku)
        self._in_flight += 1
        try:
            await self._gate.enforce(purchase, info, client)
            return await deduction.purchase(purchase)
        finally:
            self._in_flight -= 1
