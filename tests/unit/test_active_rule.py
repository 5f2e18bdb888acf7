"""Every write of a sku's stock makes the sku active again.

A sku is idle while ``inventory.idle_at`` equals its ``updated_at``
(``gateway.postgres.inventory.ACTIVE``), so a statement that changes ``stock``
without setting ``updated_at = now()`` would leave a sku whose stock changed
out of the reconciler's passes and the metrics. Scans the SQL of ``gateway/``
and ``sql/`` as tests/unit/test_sql_guard.py does; the scan is shown to catch a
planted statement, so it can fail.
"""

from __future__ import annotations

import re
from pathlib import Path

from testkit.sql_text import statements

ROOT = Path(__file__).resolve().parents[2]

SETS_STOCK = re.compile(r"\bupdate\s+inventory\s+set\b[^;]*?\bstock\s*=", re.I | re.S)
TOUCHES = re.compile(r"\bupdated_at\s*=\s*now\(\)", re.I)


def untouched(root: Path) -> list[str]:
    """Where a statement sets a sku's stock without setting its updated_at."""
    return [
        where
        for where, text in statements(root)
        if SETS_STOCK.search(text) and not TOUCHES.search(text)
    ]


def test_every_stock_write_sets_updated_at() -> None:
    """flush_batch(), the strategies' takes, restock and the admin's set all
    set updated_at = now() with the stock."""
    assert untouched(ROOT) == []
    assert len([w for w, t in statements(ROOT) if SETS_STOCK.search(t)]) >= 5


def test_a_stock_write_that_leaves_updated_at_is_found(tmp_path: Path) -> None:
    """A planted ``UPDATE inventory SET stock = stock + 1`` alone is reported."""
    (tmp_path / "gateway").mkdir()
    (tmp_path / "sql").mkdir()
    (tmp_path / "gateway" / "planted.py").write_text(
        'RETURN = "UPDATE inventory SET stock = stock + $2 WHERE sku = $1"\n'
    )
    assert untouched(tmp_path) == ["gateway/planted.py:1"]
