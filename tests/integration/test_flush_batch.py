"""Every verdict of ``flush_batch()`` in one batch, straight against PostgreSQL.

The function looks every purchase up in one statement and then decides in
arrival order in memory (``sql/functions/flush_batch.sql``). One batch here
holds each case its header lists, in an order where a lookup made per batch
instead of per purchase, or a decision out of arrival order, would show.
"""

from __future__ import annotations

import asyncpg
import pytest

FLUSH = "SELECT * FROM flush_batch($1, $2, $3, $4, $5, $6, 2)"


async def test_one_batch_with_every_verdict(con: asyncpg.Connection, sku: str) -> None:
    """Three units; earlier orders and a released reservation already written.

    In arrival order: a new buyer (granted), the same request id again (answered
    once), a replay of an earlier order (C, its own id), a request id holding
    another buyer's order (R), a released reservation (X), a buyer who already
    holds an order (D), the first new buyer again under another id (D: granted
    earlier in this very batch), three units when two are left (S), one unit
    after it, which still fits (granted: first fit, not a running sum), and the
    buyer of the three again for one unit (granted: refused for size, they hold
    nothing yet).
    """
    other = f"{sku}-other"
    await con.execute("INSERT INTO inventory (sku, stock) VALUES ($1, 7), ($2, 1)", sku, other)
    earlier = await con.fetch(
        "INSERT INTO orders (request_id, sku, user_id, qty)"
        " VALUES ($1, $2, 'old', 1), ($3, $2, 'kept', 1), ($4, $5, 'elsewhere', 1)"
        " RETURNING request_id, order_id::text",
        f"{sku}.replay",
        sku,
        f"{sku}.kept",
        f"{sku}.foreign",
        other,
    )
    order_of = {r["request_id"]: r["order_id"] for r in earlier}
    await con.execute("UPDATE inventory SET stock = 3 WHERE sku = $1", sku)
    await con.execute(
        "INSERT INTO released_reservations (request_id, reserved_at_ms) VALUES ($1, 42)",
        f"{sku}.released",
    )
    batch = [  # (request id suffix, user, qty, reserved_at_ms)
        ("new", "n1", 1, 1),
        ("new", "n1", 1, 1),
        ("replay", "old", 1, 1),
        ("foreign", "thief", 1, 1),
        ("released", "late", 1, 42),
        ("again", "kept", 1, 1),
        ("twice", "n1", 1, 1),
        ("big", "b", 3, 1),
        ("small", "s", 1, 1),
        ("smaller", "b", 1, 1),
    ]
    rows = await con.fetch(
        FLUSH,
        sku,
        [f"{sku}.{r}" for r, *_ in batch],
        [u for _, u, _, _ in batch],
        [q for _, _, q, _ in batch],
        [at for *_, at in batch],
        None,
    )
    verdicts = {r["request_id"].removeprefix(f"{sku}."): r["verdict"] for r in rows}
    assert verdicts == {
        "new": "C",
        "replay": "C",
        "foreign": "R",
        "released": "X",
        "again": "D",
        "twice": "D",
        "big": "S",
        "small": "C",
        "smaller": "C",
    }
    assert len(rows) == len(verdicts), "a request id repeated in the batch is answered once"
    by_id = {r["request_id"].removeprefix(f"{sku}."): r for r in rows}
    assert by_id["replay"]["order_id"] == order_of[f"{sku}.replay"]
    foreign = by_id["foreign"]
    assert (foreign["order_sku"], foreign["order_user"]) == (other, "elsewhere")
    assert {r["stock_after"] for r in rows} == {0}
    assert await con.fetchval("SELECT stock FROM inventory WHERE sku = $1", sku) == 0
    buyers = await con.fetch(
        "SELECT user_id FROM orders WHERE sku = $1 AND request_id = ANY($2::text[])",
        sku,
        [f"{sku}.new", f"{sku}.small", f"{sku}.smaller"],
    )
    assert sorted(r["user_id"] for r in buyers) == ["b", "n1", "s"]


async def test_an_unknown_skus_batch_is_sold_out_and_writes_nothing(
    con: asyncpg.Connection, sku: str
) -> None:
    """No order without its sku: the function finds no inventory row to lock
    and inserts nothing (sql/031_orders_sku_guard.sql: no foreign key checks
    each order any more)."""
    rows = await con.fetch(FLUSH, sku, [f"{sku}.a"], ["u"], [1], [1], None)
    assert [(r["request_id"], r["verdict"], r["order_id"]) for r in rows] == [
        (f"{sku}.a", "S", None)
    ]
    assert await con.fetchval("SELECT count(*) FROM orders WHERE sku = $1", sku) == 0


async def test_a_sku_with_orders_is_neither_deleted_nor_renamed(
    con: asyncpg.Connection, sku: str
) -> None:
    """What the foreign key on orders.sku promised, kept from inventory's side:
    23503 for a DELETE, a rename and a TRUNCATE while orders exist; a sku
    without orders goes, and a stock change of one with orders runs as ever."""
    bare = f"{sku}-bare"
    await con.execute("INSERT INTO inventory (sku, stock) VALUES ($1, 5), ($2, 5)", sku, bare)
    await con.fetch(FLUSH, sku, [f"{sku}.a"], ["u"], [1], [1], None)
    for statement in (
        "DELETE FROM inventory WHERE sku = $1",
        "UPDATE inventory SET sku = sku || '-renamed' WHERE sku = $1",
    ):
        with pytest.raises(asyncpg.ForeignKeyViolationError, match=f"sku {sku} has orders"):
            await con.execute(statement, sku)
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="while orders exist"):
        async with con.transaction():
            await con.execute("SET LOCAL lock_timeout = '10s'")
            await con.execute("TRUNCATE inventory CASCADE")
    await con.execute("UPDATE inventory SET stock = stock + 1 WHERE sku = $1", sku)
    assert await con.fetchval("SELECT stock FROM inventory WHERE sku = $1", sku) == 5
    await con.execute("UPDATE inventory SET sku = $2 WHERE sku = $1", bare, f"{bare}-renamed")
    assert (
        await con.execute("DELETE FROM inventory WHERE sku = $1", f"{bare}-renamed") == "DELETE 1"
    )
    assert await con.fetchval("SELECT count(*) FROM orders WHERE sku = $1", sku) == 1
