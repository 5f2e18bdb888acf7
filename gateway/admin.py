"""Stock administration: create or reset a sku, restock it, report on it.

Each change writes the database (with its stock movement) and then sets the
Redis counter to database stock minus the pending ledger, under the sku's
flush lock so no flush commits in between.
"""

from __future__ import annotations

from typing import Any

from gateway.catalog import Catalog
from gateway.domain import StockReport
from gateway.errors import UnknownSku
from gateway.inventory import Inventory
from gateway.orders import Orders
from gateway.rules import NO_RULES, Rate, SaleRules
from gateway.skulocks import SkuLocks
from gateway.soldout import SoldOut


class StockAdmin:
    """The admin use cases: stock changes in both stores, and reports."""

    def __init__(
        self,
        *,
        inventory: Inventory,
        orders: Orders,
        locks: SkuLocks,
        catalog: Catalog,
        soldout: SoldOut,
    ) -> None:
        self._inventory = inventory
        self._orders = orders
        self._locks = locks
        self._catalog = catalog
        self._soldout = soldout

    async def put_sku(
        self, sku: str, stock: int, per_user_limit: int, rules: SaleRules | None = None
    ) -> dict[str, Any]:
        """Create ``sku`` or reset its remaining stock (orders stay); ``rules``
        replaces its window and rates."""
        rules = rules or NO_RULES
        async with self._locks.held(sku):
            await self._orders.put_sku(sku, stock, per_user_limit, rules)
            redis_stock = await self._inventory.load_stock(sku, stock, reset=True)
        self._forget(sku)
        return {
            "sku": sku,
            "stock": stock,
            "per_user_limit": per_user_limit,
            "redis_stock": redis_stock,
            **rules.window_json(),
            "user_rate": _shown(rules.user_rate),
            "client_rate": _shown(rules.client_rate),
        }

    async def restock(self, sku: str, delta: int) -> dict[str, Any]:
        """Add ``delta`` units to ``sku``; raises :class:`UnknownSku`."""
        async with self._locks.held(sku):
            stock = await self._orders.restock(sku, delta)
            if stock is None:
                raise UnknownSku(f"no sku {sku!r}")
            redis_stock = await self._inventory.load_stock(sku, stock, reset=True)
        self._forget(sku)
        return {"sku": sku, "stock": stock, "redis_stock": redis_stock}

    async def report(self, sku: str) -> StockReport:
        """Database stock, Redis stock, pending units and units sold of ``sku``."""
        db_stock = await self._orders.stock(sku)
        if db_stock is None:
            raise UnknownSku(f"no sku {sku!r}")
        pending = sum(p.qty for p in await self._inventory.pending(sku))
        return StockReport(
            sku=sku,
            db_stock=db_stock,
            redis_stock=await self._inventory.available(sku),
            pending=pending,
            sold=await self._orders.units_sold(sku),
        )

    def _forget(self, sku: str) -> None:
        # This instance's own caches; the others learn from pub/sub.
        self._catalog.forget(sku)
        self._soldout.clear(sku)


def _shown(rate: Rate | str | None) -> str | None:
    """A sku's own rate as the API shows it (None: the instance's default)."""
    return None if rate is None else str(rate)
