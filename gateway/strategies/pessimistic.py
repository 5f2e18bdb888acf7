"""``pessimistic``: lock the inventory row, look, then take.

``SELECT ... FOR UPDATE`` queues the sku's buyers on the row lock, so each
decides on stock nobody else can change before its commit; the UPDATE keeps its
``stock >= $2`` guard (``TAKE_STOCK``) all the same, the floor if anything
writes the row without the lock.
"""

from __future__ import annotations

from gateway.domain.errors import StockGuardRefused
from gateway.domain.model import Purchase, Result
from gateway.postgres.database import Connection
from gateway.strategies.rows import Rows
from gateway.strategies.sql_direct import TAKE_STOCK

LOCK_STOCK = "SELECT stock FROM inventory WHERE sku = $1 FOR UPDATE"


async def take_locked(con: Connection, purchase: Purchase) -> bool:
    """Lock the row; take the units if the locked stock holds them."""
    stock = await con.fetchval(LOCK_STOCK, purchase.sku)
    if stock is None or stock < purchase.qty:
        return False
    if await con.fetchval(TAKE_STOCK, purchase.sku, purchase.qty) is None:
        # Unreachable while the lock is held; raised, it rolls the purchase back.
        raise StockGuardRefused("the stock guard refused a locked purchase")
    return True


class Pessimistic:
    """The ``pessimistic`` strategy."""

    def __init__(self, rows: Rows) -> None:
        self._rows = rows

    async def purchase(self, purchase: Purchase) -> Result:
        """Decide one purchase under the inventory row's lock."""
        return await self._rows.decide(purchase, take_locked)
