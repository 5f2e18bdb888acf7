"""Every statement that takes stock carries its guard.

Scans the SQL in ``gateway/`` (string constants, via the AST) and ``sql/``
(statements split on ``;``) for anything that lowers ``stock`` and fails when
such a statement lacks a ``stock >=`` or ``stock >`` condition. The scan is
shown to catch a planted unguarded statement, so it can fail.
"""

from __future__ import annotations

import re
from pathlib import Path

from testkit.sql_text import statements

ROOT = Path(__file__).resolve().parents[2]
TAKES_STOCK = re.compile(r"\bstock\s*=\s*stock\s*-|\bstock\s*=\s*\$\d+\s*-|-=\s*stock", re.I)
GUARD = re.compile(r"\bwhere\b.*\bstock\s*>=?\s*", re.I | re.S)


def unguarded(root: Path) -> list[str]:
    """Where a statement lowers stock without a stock guard."""
    return [
        where
        for where, text in statements(root)
        if TAKES_STOCK.search(text) and not GUARD.search(text)
    ]


def test_every_stock_decrement_in_the_tree_is_guarded() -> None:
    """The gateway's SQL lowers stock only under ``stock >=`` / ``stock >``."""
    takers = [w for w, text in statements(ROOT) if TAKES_STOCK.search(text)]
    assert takers, "the scan found no statement that takes stock: it is looking in the wrong place"
    assert unguarded(ROOT) == []


def test_the_scan_catches_a_planted_unguarded_statement(tmp_path: Path) -> None:
    """An UPDATE without its guard, in Python or in a migration, is reported."""
    (tmp_path / "gateway").mkdir()
    (tmp_path / "sql").mkdir()
    (tmp_path / "gateway" / "bad.py").write_text(
        'GOOD = "UPDATE inventory SET stock = stock - $2 WHERE sku = $1 AND stock >= $2"\n'
        'BAD = "UPDATE inventory SET stock = stock - $2 WHERE sku = $1"\n'
    )
    (tmp_path / "sql" / "900_bad.sql").write_text(
        "UPDATE inventory SET stock = stock - 1 WHERE sku = 'x';\n"
        "UPDATE inventory SET stock = stock - 1 WHERE sku = 'y' AND stock > 0;\n"
    )
    assert unguarded(tmp_path) == ["gateway/bad.py:2", "sql/900_bad.sql#0"]


def test_the_scan_covers_every_strategys_statements() -> None:
    """The synchronous strategies' statements that take stock are among those scanned
    (and so guarded): sql-direct's, and optimistic's beside its version check."""
    takers = {w.split(":")[0] for w, text in statements(ROOT) if TAKES_STOCK.search(text)}
    assert {
        "gateway/strategies/sql_direct.py",
        "gateway/strategies/optimistic.py",
    } <= takers
