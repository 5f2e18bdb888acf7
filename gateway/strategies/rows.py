"""The PostgreSQL adapter of the synchronous strategies: one purchase, one transaction.

:meth:`Rows.decide` runs the part every strategy shares: the request id's prior
order (a replay, or a mismatch) and the buyer's (a duplicate), then the
strategy's own step that takes the stock (:data:`Take`), then the INSERT of the
order. The unique constraints on ``orders`` (one order per request id, one per
sku and buyer) decide a race between two such transactions: the loser's INSERT
fails, its transaction rolls back with the stock it took, and it is answered
from the winner's row. Driver errors become
:class:`gateway.domain.errors.PostgresUnavailable` here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg

from gateway.domain.errors import GroupLimitReached, IdempotencyMismatch, PostgresUnavailable
from gateway.domain.model import DUPLICATE, SOLD_OUT, Outcome, Purchase, Result
from gateway.postgres.database import Connection, as_unavailable
from gateway.postgres.orders import order_of

# The request id's own order, and any order of this buyer of this sku: one
# round trip for one purchase's replay and duplicate checks, inside its
# transaction (gateway.postgres.orders asks the same of many purchases at once
# while a sku is rebuilt: ORDERS_BY_REQUESTS_OR_BUYERS).
# Then, for a sku in a limit group whose buyer already holds too much of it to
# take $4 more, one row naming the group (request_id NULL): refused early, before
# the stock is taken (the insert trigger of sql/020_limit_groups.sql is the
# floor either way).
ORDERS_BY_REQUEST_OR_BUYER = """
SELECT order_id::text, request_id, sku, user_id, qty, status, pay_by FROM orders
WHERE request_id = $1
    OR (sku = $2 AND user_id = $3 AND status IN ('confirmed', 'pending_payment', 'paid'))
UNION ALL
SELECT NULL, NULL, g.limit_group, NULL, NULL, NULL, NULL
FROM inventory i JOIN limit_groups g ON g.limit_group = i.limit_group
JOIN group_holdings h ON h.limit_group = i.limit_group AND h.user_id = $3
WHERE i.sku = $2 AND h.units + $4 > g.per_user_limit
"""
# The order, pending payment until now() + the sku's window when it has one.
INSERT_ORDER = """
INSERT INTO orders (request_id, sku, user_id, qty, status, pay_by)
SELECT $1, $2, $3, $4,
    CASE WHEN payment_window_s > 0 THEN 'pending_payment' ELSE 'confirmed' END,
    CASE WHEN payment_window_s > 0 THEN now() + make_interval(secs => payment_window_s) END
FROM inventory WHERE sku = $2
RETURNING order_id::text, request_id, sku, user_id, qty, status, pay_by
"""


# The SQLSTATE of the orders' insert trigger that refuses an order taking its
# buyer past their limit group's limit (gateway.postgres.orders.FLUSH_ERRORS).
GROUP_GUARD = "FS003"


# A strategy's step: take ``purchase.qty`` units of its sku on ``con``, inside
# the transaction; False when too little stock is left (sold out). Each carries
# its stock >= guard; an exception it raises rolls the transaction back.
Take = Callable[[Connection, Purchase], Awaitable[bool]]


def _answer(row: asyncpg.Record, purchase: Purchase) -> Result:
    """The answer an existing order gives ``purchase``."""
    if row["request_id"] != purchase.request_id:
        return DUPLICATE  # the buyer's order of this sku, under another request id
    if (row["sku"], row["user_id"], row["qty"]) != (purchase.sku, purchase.user_id, purchase.qty):
        raise IdempotencyMismatch(purchase.request_id)
    return Result(Outcome.CONFIRMED, order_of(row).as_first_answered())


async def _prior(con: Connection, purchase: Purchase) -> Result | None:
    """The answer the orders already give (replay, mismatch, duplicate), if any;
    raises :class:`GroupLimitReached` when none does and the buyer holds their
    limit group's limit."""
    p = purchase
    rows = await con.fetch(ORDERS_BY_REQUEST_OR_BUYER, p.request_id, p.sku, p.user_id, p.qty)
    # The request id's own order decides before the buyer's other order does,
    # and either before the limit group.
    rows.sort(key=lambda r: (r["request_id"] is None, r["request_id"] != p.request_id))
    if not rows:
        return None
    if rows[0]["request_id"] is None:
        raise GroupLimitReached(rows[0]["sku"])
    return _answer(rows[0], purchase)


class Rows:
    """Purchases decided one per transaction on the inventory row and the orders."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def decide(self, purchase: Purchase, take: Take) -> Result:
        """Decide ``purchase`` in one transaction with ``take``.

        Raises what ``take`` raises (after the rollback);
        :class:`IdempotencyMismatch` when the request id holds another purchase;
        :class:`PostgresUnavailable` when PostgreSQL failed: then nothing was
        written, or (the connection broke at the commit) the order may exist,
        which a retry of the same request id answers with.
        """
        with as_unavailable:
            async with self.pool.acquire() as con:
                try:
                    return await self._decide(con, purchase, take)
                except asyncpg.UniqueViolationError:
                    # Rolled back, stock and all: another transaction committed
                    # this request id or this buyer's order first.
                    settled = await _prior(con, purchase)
                    if settled is None:  # its order is gone again: an admin's doing
                        raise PostgresUnavailable("order conflict; retry") from None
                    return settled
                except asyncpg.PostgresError as exc:
                    if exc.sqlstate != GROUP_GUARD:
                        raise
                    # Rolled back, stock and all: the insert trigger found the
                    # buyer at their limit group's limit (sql/020_limit_groups.sql).
                    raise GroupLimitReached(getattr(exc, "detail", None) or "") from None

    @staticmethod
    async def _decide(con: Connection, purchase: Purchase, take: Take) -> Result:
        async with con.transaction():
            prior = await _prior(con, purchase)
            if prior is not None:
                return prior
            if not await take(con, purchase):
                return SOLD_OUT
            p = purchase
            row = await con.fetchrow(INSERT_ORDER, p.request_id, p.sku, p.user_id, p.qty)
            assert row is not None  # take() locked the sku's inventory row: it exists
            return Result(Outcome.CONFIRMED, order_of(row))
