"""``sql-direct``: each purchase one transaction, the guarded UPDATE then the INSERT.

No reservation and no lock of our own: under read committed a second UPDATE of
the row waits for the first to commit and then checks ``stock >= $2`` against
the newest row, so the guard alone stops an oversell.
"""

from __future__ import annotations

from gateway.domain.model import Purchase, Result
from gateway.postgres.database import Connection
from gateway.strategies.rows import Rows

TAKE_STOCK = """
UPDATE inventory SET stock = stock - $2, updated_at = now()
WHERE sku = $1 AND stock >= $2 RETURNING stock
"""


async def take_guarded(con: Connection, purchase: Purchase) -> bool:
    """Take the units if they are there (the row's lock is held to the commit)."""
    return await con.fetchval(TAKE_STOCK, purchase.sku, purchase.qty) is not None


class SqlDirect:
    """The ``sql-direct`` strategy."""

    def __init__(self, rows: Rows) -> None:
        self._rows = rows

    async def purchase(self, purchase: Purchase) -> Result:
        """Decide one purchase in one transaction."""
        return await self._rows.decide(purchase, take_guarded)
