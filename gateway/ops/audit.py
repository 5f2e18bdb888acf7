"""The stock audit: do the database's books balance, and does Redis agree?

``flashsale-gateway audit [--sku SKU]`` prints one row per sku and exits 0 when
every row is ``ok`` or only warns, 1 on a hard failure, 2 when a store cannot be
read or the sku does not exist. :func:`audit` and :func:`render` do the same
in-process for tests and the chaos suite.

Definitions, per sku (one SQL statement, so one snapshot even during a sale):

- ``provided`` = sum of ``stock_movements.delta`` of the admin's movements: the
  net units the admin ever made available (an order's return, reason
  ``expired``, ``cancelled`` or ``refunded``, is not provided: it returns
  what was).
  ``restock`` records ``+n``; ``set`` records the new stock minus the remaining
  stock it replaced (read under the row lock), so a reset provides the
  difference or takes it back. Computed from the movement log alone,
  independently of ``inventory.stock`` and of ``orders``.
- ``sold`` = sum of ``orders.qty`` of orders ``confirmed`` or ``paid``, and
  of those ``refunded`` without restock (their units left the stock for good;
  a refund with restock is a return, like a cancel's);
  ``held`` = the same of orders ``pending_payment`` (their units are held until
  paid, cancelled or expired); ``orders`` = the count of these live orders;
  ``users`` = the number of their distinct buyers. An expired or cancelled
  order counts nowhere: its units went back to the stock.
- Every transaction that changes ``inventory.stock`` either records a movement
  of exactly that change (admin) or inserts orders of exactly that many units
  (a flush), and every return both adds its units and records them, so
  ``provided == db_stock + held + sold`` (on sale + held + paid/confirmed)
  must hold exactly; and since stock never goes below zero,
  ``sold + held <= provided``.
- ``pending`` = units in the Redis ledger; ``drift = db_stock - (redis_stock +
  pending)``, only when the Redis stock key exists. A reservation moves units
  from Redis stock to the ledger, and a flush takes them from the database and
  the ledger, so a quiet sku has no drift. A sku whose strategy keeps no Redis
  state (``Strategy.reserves`` false) has no counter and no ledger: Redis is
  not read for it (``redis_stock`` and ``drift`` show ``-``), and its books are
  checked all the same.

Findings, worst first; the first four are failures, the last a warning:

- ``OVERSOLD``: ``sold + held > provided``, units sold that were never provided.
- ``DUPLICATE_USER``: a user holds two live orders of the sku (``GROUP BY user_id``).
- ``NEGATIVE_STOCK``: database or Redis stock below zero.
- ``UNBALANCED``: ``db_stock != provided - held - sold``.
- ``DRIFT``: ``drift != 0``. A flush committed but not yet settled, and Redis
  being read just after the database, explain some; the reconciler repairs it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import asyncpg

from gateway.domain.errors import GatewayError, Unavailable, UnknownSku
from gateway.domain.model import Strategy
from gateway.postgres.database import DB_ERRORS, connect
from gateway.redis.connections import create_redis, reach
from gateway.redis.layout import KeyTags
from gateway.redis.reservations import Reservations
from gateway.settings import Misconfigured, Settings

# One statement, so the movements, orders and stock come from one snapshot.
# $1 is a sku, or NULL for every sku.
BOOKS = """
WITH movements AS (
    SELECT sku, SUM(delta) AS provided FROM stock_movements
    WHERE ($1::text IS NULL OR sku = $1) AND reason NOT IN ('expired', 'cancelled', 'refunded')
    GROUP BY sku
), sales AS (
    SELECT sku, count(*) FILTER (WHERE status <> 'refunded') AS orders,
        COALESCE(SUM(qty) FILTER (WHERE status <> 'pending_payment'), 0) AS sold,
        COALESCE(SUM(qty) FILTER (WHERE status = 'pending_payment'), 0) AS held,
        count(DISTINCT user_id) FILTER (WHERE status <> 'refunded') AS users
    FROM orders WHERE ($1::text IS NULL OR sku = $1)
        AND (status IN ('confirmed', 'pending_payment', 'paid')
            OR (status = 'refunded' AND NOT restocked))
    GROUP BY sku
), repeat_buyers AS (
    SELECT sku, count(*) AS duplicate_users FROM (
        SELECT sku, user_id FROM orders WHERE ($1::text IS NULL OR sku = $1)
            AND status IN ('confirmed', 'pending_payment', 'paid')
        GROUP BY sku, user_id HAVING count(*) > 1
    ) AS repeats GROUP BY sku
)
SELECT i.sku, i.stock AS db_stock, i.strategy, i.limit_group,
    COALESCE(m.provided, 0)::bigint AS provided,
    COALESCE(s.orders, 0)::bigint AS orders,
    COALESCE(s.sold, 0)::bigint AS sold,
    COALESCE(s.held, 0)::bigint AS held,
    COALESCE(s.users, 0)::bigint AS users,
    COALESCE(r.duplicate_users, 0)::bigint AS duplicate_users
FROM inventory AS i
LEFT JOIN movements AS m USING (sku)
LEFT JOIN sales AS s USING (sku)
LEFT JOIN repeat_buyers AS r USING (sku)
WHERE $1::text IS NULL OR i.sku = $1
ORDER BY i.sku
"""


class Finding(StrEnum):
    """What the audit found on a row, worst first."""

    OVERSOLD = "OVERSOLD"
    DUPLICATE_USER = "DUPLICATE_USER"
    NEGATIVE_STOCK = "NEGATIVE_STOCK"
    UNBALANCED = "UNBALANCED"
    DRIFT = "DRIFT"
    OK = "ok"


FAILURES = frozenset(
    {Finding.OVERSOLD, Finding.DUPLICATE_USER, Finding.NEGATIVE_STOCK, Finding.UNBALANCED}
)


@dataclass(frozen=True, slots=True)
class SkuAudit:
    """One sku's books in PostgreSQL and counters in Redis."""

    sku: str
    provided: int
    db_stock: int
    orders: int
    sold: int
    users: int
    duplicate_users: int
    redis_stock: int | None
    pending: int
    # Units of orders pending payment.
    held: int = 0

    @property
    def drift(self) -> int | None:
        """Database stock minus Redis stock and pending units; None without Redis stock."""
        if self.redis_stock is None:
            return None
        return self.db_stock - (self.redis_stock + self.pending)

    @property
    def findings(self) -> tuple[Finding, ...]:
        """Every verdict that applies, worst first; empty when the row is ok."""
        checks = {
            Finding.OVERSOLD: self.sold + self.held > self.provided,
            Finding.DUPLICATE_USER: self.duplicate_users > 0,
            Finding.NEGATIVE_STOCK: self.db_stock < 0 or (self.redis_stock or 0) < 0,
            Finding.UNBALANCED: self.db_stock != self.provided - self.held - self.sold,
            Finding.DRIFT: bool(self.drift),
        }
        return tuple(verdict for verdict, found in checks.items() if found)

    @property
    def verdict(self) -> Finding:
        """The worst finding, or ``ok``."""
        findings = self.findings
        return findings[0] if findings else Finding.OK

    @property
    def failed(self) -> bool:
        """Whether a finding is a failure rather than a warning."""
        return any(f in FAILURES for f in self.findings)


async def audit(settings: Settings, sku: str | None = None) -> list[SkuAudit]:
    """Audit ``sku``, or every sku of the inventory, in sku order.

    Reads ``settings.database_url``, then the Redis ``settings`` name (a single
    server, Sentinels or a cluster, as the gateway would) under
    ``settings.key_prefix``. Raises :class:`UnknownSku` when ``sku`` is not in
    the inventory, :class:`Misconfigured` when a store's setting names nothing
    usable, and :class:`Unavailable` when a store cannot be read.
    """
    books = await _read_books(settings.database_url, sku)
    if sku is not None and not books:
        raise UnknownSku(f"no sku {sku!r}")
    with_redis = [row["sku"] for row in books if _keeps_redis_state(row, settings)]
    # A sku in a limit group keeps its Redis state in the group's slot.
    tags = KeyTags({row["sku"]: row["limit_group"] for row in books if row["limit_group"]})
    counters_read = await _read_counters(settings, with_redis, tags)
    read = dict(zip(with_redis, counters_read, strict=True))
    counters = [read.get(row["sku"], (None, 0)) for row in books]
    return [
        SkuAudit(
            sku=row["sku"],
            provided=row["provided"],
            db_stock=row["db_stock"],
            orders=row["orders"],
            sold=row["sold"],
            held=row["held"],
            users=row["users"],
            duplicate_users=row["duplicate_users"],
            redis_stock=redis_stock,
            pending=pending,
        )
        for row, (redis_stock, pending) in zip(books, counters, strict=True)
    ]


def _keeps_redis_state(row: asyncpg.Record, settings: Settings) -> bool:
    """Whether the sku's strategy (its own, else the gateway's) keeps Redis state."""
    strategy = settings.strategy if row["strategy"] is None else Strategy(row["strategy"])
    return strategy.reserves


async def _read_books(database_url: str, sku: str | None) -> list[asyncpg.Record]:
    con = await connect(database_url)
    try:
        try:
            return await con.fetch(BOOKS, sku, timeout=30)
        finally:
            await con.close()
    except DB_ERRORS as exc:
        raise Unavailable(_one_line("postgres", exc)) from exc


async def _read_counters(
    settings: Settings, skus: Sequence[str], tags: KeyTags
) -> list[tuple[int | None, int]]:
    """(Redis stock or None, pending units) per sku, each pair read atomically
    (the stock adapter's snapshot script)."""
    redis = create_redis(settings)
    reservations = Reservations(redis, settings, tags=tags)
    counters = []
    try:
        # Even with no sku to read, a Redis setting that names something else
        # is reported; a Redis that answers nothing yet only matters to the
        # skus that keep state there (the others' books are PostgreSQL's alone).
        try:
            await reach(redis, settings)
        except Misconfigured as exc:
            if exc.final or skus:
                raise
            return []
        for sku in skus:
            try:
                stock, entries = await reservations.snapshot(sku)
            except ValueError:
                raise Unavailable(f"redis: a malformed ledger entry of sku {sku!r}") from None
            counters.append((stock, sum(entry.qty for entry in entries)))
    finally:
        await redis.aclose()
    return counters


def _one_line(store: str, exc: BaseException) -> str:
    detail = " ".join(str(exc).split())
    return f"{store}: {type(exc).__name__}" + (f": {detail}" if detail else "")


COLUMNS = (
    "sku",
    "provided",
    "db_stock",
    "orders",
    "sold",
    "held",
    "users",
    "redis_stock",
    "pending",
    "drift",
    "verdict",
)


def _cells(row: SkuAudit) -> tuple[str, ...]:
    def num(value: int | None) -> str:
        return "-" if value is None else str(value)

    findings = ",".join(row.findings) or Finding.OK
    numbers = (row.provided, row.db_stock, row.orders, row.sold, row.held, row.users)
    return (
        row.sku,
        *map(num, numbers),
        num(row.redis_stock),
        num(row.pending),
        num(row.drift),
        findings,
    )


def render(rows: Sequence[SkuAudit]) -> str:
    """A plain-text table: a header, then one line per row, every finding listed."""
    table = [COLUMNS, *map(_cells, rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    last = len(COLUMNS) - 1
    lines = []
    for line in table:
        cells = [
            cell.ljust(width) if i in (0, last) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def exit_code(rows: Sequence[SkuAudit]) -> int:
    """0 when no row failed (warnings allowed), else 1."""
    return 1 if any(row.failed for row in rows) else 0


def run(settings: Settings, sku: str | None = None) -> int:
    """The ``audit`` command: print the table; returns the exit code (0, 1 or 2)."""
    try:
        rows = asyncio.run(audit(settings, sku))
    except (GatewayError, Misconfigured) as exc:
        print(f"flashsale-gateway audit: {exc}", file=sys.stderr)
        return 2
    print(render(rows), flush=True)
    return exit_code(rows)
