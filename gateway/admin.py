"""Stock administration: create or reset a sku, restock it, report on it.

Each change writes the database (with its stock movement) and then sets the
Redis counter to database stock minus the pending ledger, under the sku's
flush lock so no flush commits in between.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any

from gateway.domain import StockReport
from gateway.errors import UnknownSku
from gateway.service import PurchaseService


class StockAdmin:
    """The admin use cases over one :class:`PurchaseService`'s adapters."""

    def __init__(self, service: PurchaseService) -> None:
        self._service = service

    async def put_sku(self, sku: str, stock: int, per_user_limit: int) -> dict[str, Any]:
        """Create ``sku`` or reset its remaining stock (orders stay)."""
        async with self._locked(sku):
            await self._service.orders.put_sku(sku, stock, per_user_limit)
            redis_stock = await self._service.inventory.load_stock(sku, stock, reset=True)
        self._forget(sku)
        return {
            "sku": sku,
            "stock": stock,
            "per_user_limit": per_user_limit,
            "redis_stock": redis_stock,
        }

    async def restock(self, sku: str, delta: int) -> dict[str, Any]:
        """Add ``delta`` units to ``sku``; raises :class:`UnknownSku`."""
        async with self._locked(sku):
            stock = await self._service.orders.restock(sku, delta)
            if stock is None:
                raise UnknownSku(f"no sku {sku!r}")
            redis_stock = await self._service.inventory.load_stock(sku, stock, reset=True)
        self._forget(sku)
        return {"sku": sku, "stock": stock, "redis_stock": redis_stock}

    async def report(self, sku: str) -> StockReport:
        """Database stock, Redis stock, pending units and units sold of ``sku``."""
        service = self._service
        db_stock = await service.orders.stock(sku)
        if db_stock is None:
            raise UnknownSku(f"no sku {sku!r}")
        pending = sum(p.qty for p in await service.inventory.pending(sku))
        return StockReport(
            sku=sku,
            db_stock=db_stock,
            redis_stock=await service.inventory.available(sku),
            pending=pending,
            sold=await service.orders.units_sold(sku),
        )

    def _locked(self, sku: str) -> AbstractAsyncContextManager[Any]:
        lock_for = self._service.lock_for
        return nullcontext() if lock_for is None else lock_for(sku)(wait=self._service.lock_wait)

    def _forget(self, sku: str) -> None:
        # This instance's own caches; the others learn from pub/sub.
        self._service.catalog.forget(sku)
        self._service.soldout.clear(sku)
