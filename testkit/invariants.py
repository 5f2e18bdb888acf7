"""What must hold after a scenario, checked in PostgreSQL against what clients saw.

PostgreSQL is the truth: an order exists if and only if its row does. Hard
problems (any of them fails a scenario):

* oversell: units in orders beyond the stock provided;
* a user with two orders of the sku;
* database stock != provided - sold, or stock_movements not adding up to
  what was provided;
* a false confirmation: a client saw 201 but no row has its request id, or
  the row has another order_id;
* a contradiction: a client's final answer was not 201 (sold_out, duplicate,
  an error) yet its request id has an order;
* a foreign order: a row whose request id no client sent.

Reported, and failing only when a scenario says so:

* lost: units still in the database while clients who wanted them ended with
  no order (stock stranded, e.g. in reservations nobody settled);
* unacknowledged: orders whose client gave up without a final answer (the
  buyer was charged but never told; expected under some faults).

Run it once the gateways are quiet (stopped, or the driver done and flushes
over): a flush still running may add an order after the check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg

from testkit.driver import CONFIRMED, ClientRecord, DriverSummary

ORDERS = "SELECT request_id, order_id::text AS order_id, user_id, qty FROM orders WHERE sku = $1"
DOUBLE_BUYERS = """
SELECT user_id FROM orders WHERE sku = $1 GROUP BY user_id HAVING count(*) > 1 ORDER BY user_id
"""
STOCK = "SELECT stock FROM inventory WHERE sku = $1"
HAS_MOVEMENTS = "SELECT to_regclass('stock_movements') IS NOT NULL"
MOVEMENTS = "SELECT COALESCE(sum(delta), 0) FROM stock_movements WHERE sku = $1"


@dataclass
class InvariantReport:
    """The checks of one scenario; :meth:`line` renders them on one line."""

    scenario: str
    faults: str
    sku: str
    provided: int
    clients: int
    requests: int
    outcomes: str
    sold: int = 0
    db_stock: int | None = None
    movements_total: int | None = None
    double_buyers: list[str] = field(default_factory=list)
    false_confirmations: list[str] = field(default_factory=list)
    order_id_mismatches: list[str] = field(default_factory=list)
    contradicted: list[str] = field(default_factory=list)
    foreign_orders: list[str] = field(default_factory=list)
    unacknowledged: list[str] = field(default_factory=list)
    lost: int = 0

    @property
    def oversell(self) -> int:
        """Units sold beyond the stock provided."""
        return max(self.sold - self.provided, 0)

    @property
    def stock_drift(self) -> int | None:
        """db stock - (provided - sold): 0 when the database adds up."""
        return None if self.db_stock is None else self.db_stock - (self.provided - self.sold)

    def problems(self, *, allow_lost: bool = False, allow_unacknowledged: bool = True) -> list[str]:
        """Every violated invariant, as a sentence; empty when all hold."""
        found = []
        if self.oversell:
            found.append(f"oversell: {self.sold} sold of {self.provided}")
        if self.db_stock is None:
            found.append(f"no inventory row for {self.sku!r}")
        elif self.stock_drift:
            found.append(f"db stock {self.db_stock} != provided {self.provided} - sold {self.sold}")
        if self.movements_total is not None and self.movements_total != self.provided:
            found.append(f"stock_movements add up to {self.movements_total}, not {self.provided}")
        lists = {
            "users with two orders": self.double_buyers,
            "false confirmations (201, no row)": self.false_confirmations,
            "201 with another order_id than the row": self.order_id_mismatches,
            "told no, but ordered": self.contradicted,
            "orders nobody requested": self.foreign_orders,
        }
        if not allow_unacknowledged:
            lists["orders whose client never got an answer"] = self.unacknowledged
        found += [f"{what}: {items[:5]}" for what, items in lists.items() if items]
        if self.lost and not allow_lost:
            found.append(f"lost: {self.lost} units unsold while buyers were turned away")
        return found

    @property
    def ok(self) -> bool:
        """Whether every hard invariant holds and nothing was lost."""
        return not self.problems()

    def line(self) -> str:
        """scenario | faults | requests | outcomes | sold/stock | oversell | lost | false conf."""
        false = len(self.false_confirmations) + len(self.order_id_mismatches)
        return (
            f"{self.scenario} | {self.faults} | {self.clients} clients/{self.requests} requests"
            f" | {self.outcomes} | sold {self.sold}/{self.provided} | oversell {self.oversell}"
            f" | lost {self.lost} | false confirmations {false}"
        )

    def __str__(self) -> str:
        problems = self.problems()
        return self.line() + ("" if not problems else "\n  " + "\n  ".join(problems))


async def check_invariants(
    database_url: str,
    sku: str,
    provided: int,
    summaries: DriverSummary | Sequence[DriverSummary],
    *,
    scenario: str = "",
    faults: str = "none",
) -> InvariantReport:
    """Check ``sku`` in the database against every client record of ``summaries``.

    ``provided`` is the stock the scenario put in (all PUTs and restocks).
    """
    if isinstance(summaries, DriverSummary):
        summaries = [summaries]
    records = [r for s in summaries for r in s.records]
    outcomes = DriverSummary(sku, records, 0.0).counts_text()
    report = InvariantReport(
        scenario=scenario,
        faults=faults,
        sku=sku,
        provided=provided,
        clients=len(records),
        requests=sum(s.requests for s in summaries),
        outcomes=outcomes,
    )
    con = await asyncpg.connect(database_url, timeout=10)
    try:
        rows = await con.fetch(ORDERS, sku)
        report.double_buyers = [r["user_id"] for r in await con.fetch(DOUBLE_BUYERS, sku)]
        report.db_stock = await con.fetchval(STOCK, sku)
        if await con.fetchval(HAS_MOVEMENTS):
            report.movements_total = int(await con.fetchval(MOVEMENTS, sku))
    finally:
        await con.close()
    report.sold = sum(r["qty"] for r in rows)
    _compare(report, records, {r["request_id"]: r["order_id"] for r in rows})
    return report


def _compare(report: InvariantReport, records: list[ClientRecord], rows: dict[str, str]) -> None:
    """Fill in what compares client records with order rows (request id -> order id)."""
    sent = {r.request_id for r in records}
    report.foreign_orders = sorted(set(rows) - sent)
    unmet = 0
    for record in records:
        order_id = rows.get(record.request_id)
        if record.outcome == CONFIRMED:
            if order_id is None:
                report.false_confirmations.append(record.request_id)
            elif order_id != record.order_id:
                report.order_id_mismatches.append(
                    f"{record.request_id}: saw {record.order_id}, row {order_id}"
                )
        elif order_id is not None:
            if record.final:
                report.contradicted.append(f"{record.request_id}: {record.outcome}")
            else:
                report.unacknowledged.append(record.request_id)
        else:
            unmet += record.qty
    # Units still in stock while buyers went without: what the sale lost.
    remaining = max(report.db_stock or 0, 0)
    report.lost = min(remaining, unmet)
