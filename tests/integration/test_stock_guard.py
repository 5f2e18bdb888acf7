"""The stock guard of ``flush_batch()``: the floor that refuses a batch (FS002).

``flush_batch()`` decides each purchase against the stock it read under the
row lock, then takes the granted units with ``UPDATE ... WHERE stock >= total``.
The row lock means the guard never refuses a correct decision: lowering the
stock behind the gateway's back only makes the decision answer sold out
(verdict S; :meth:`TestRealFunction.test_too_little_stock_is_sold_out_not_refused`).
The guard is there for a decision that is wrong, so these tests plant one: the
function from ``sql/functions/flush_batch.sql`` with the classic off-by-one
(``qty <= left + 1``) in its decision loop, which grants one unit too many.
The guard then refuses the batch for real, in PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from testkit.purchases import buy, client_metric, db_state, put_sku, redis_state

FUNCTION = Path(__file__).resolve().parents[2] / "sql" / "functions" / "flush_batch.sql"
DECIDES = "ELSIF rec.q <= v_left THEN"
FLUSH = "SELECT * FROM flush_batch($1, $2, $3, $4, $5, $6, 2)"
INVENTORY = "SELECT stock FROM inventory WHERE sku = $1"
ORDERS = "SELECT count(*) FROM orders WHERE sku = $1"


def off_by_one() -> str:
    """flush_batch.sql with its decision loop granting one unit more than is left."""
    text = FUNCTION.read_text()
    assert text.count(DECIDES) == 1, "the decision loop changed: update the planted bug"
    return text.replace(DECIDES, "ELSIF rec.q <= v_left + 1 THEN")


async def flush(con: asyncpg.Connection, sku: str, users: list[str]) -> list[asyncpg.Record]:
    """flush_batch() on one unit for each of ``users`` (request id ``<sku>.<user>``)."""
    rids = [f"{sku}.{u}" for u in users]
    return await con.fetch(FLUSH, sku, rids, users, [1] * len(users), [1] * len(users), None)


class TestRealFunction:
    """The shipped function refuses by its decision, never by its guard."""

    async def test_too_little_stock_is_sold_out_not_refused(
        self, con: asyncpg.Connection, sku: str
    ) -> None:
        """One unit for two buyers: the first is confirmed, the second sold out
        (S), and nothing is raised."""
        await con.execute("INSERT INTO inventory (sku, stock) VALUES ($1, 1)", sku)
        rows = await flush(con, sku, ["a", "b"])
        assert {r["order_user"] or r["request_id"]: r["verdict"] for r in rows} == {
            "a": "C",
            f"{sku}.b": "S",
        }
        assert await con.fetchval(INVENTORY, sku) == 0


class TestGuardRefusal:
    """A decision that grants more than the row holds is refused whole: FS002."""

    async def test_flush_batch_raises_fs002_and_writes_nothing(
        self, con: asyncpg.Connection, sku: str
    ) -> None:
        """With the planted off-by-one, two buyers of the last unit are both granted;
        the guard refuses: SQLSTATE FS002, no order row, the stock unchanged. The
        planted function lives only in a transaction that is rolled back."""
        await con.execute("INSERT INTO inventory (sku, stock) VALUES ($1, 1)", sku)
        outer = con.transaction()
        await outer.start()
        try:
            await con.execute(off_by_one())
            with pytest.raises(asyncpg.PostgresError) as refused:
                async with con.transaction():  # a savepoint: the outer one lives on
                    await flush(con, sku, ["a", "b"])
            assert refused.value.sqlstate == "FS002", refused.value
            assert "stock guard refused 2 units" in str(refused.value)
            assert (await con.fetchval(INVENTORY, sku), await con.fetchval(ORDERS, sku)) == (
                1,
                0,
            )
        finally:
            await outer.rollback()

    async def test_gateway_answers_503_gives_back_and_counts_a_stock_guard_refusal(
        self,
        start_gateway: Any,
        sku: str,
        database_url: str,
        redis: Redis,
        key_prefix: str,
    ) -> None:
        """Redis holds 3 units, the database row was lowered to 0 behind the
        gateway's back, and the planted off-by-one grants a buyer one: the guard
        refuses. The buyer is answered 503 (not retried: no fencing involved), the
        reservation is given back (Redis stock 3, ledger empty), nothing is
        written, and the failure is counted as ``stock_guard``, not fenced out.
        With the shipped function back, the same request is answered sold out and
        Redis is brought down to the database's 0."""
        client = await start_gateway()
        await put_sku(client, sku, 3)
        admin = await asyncpg.connect(database_url)
        try:
            await admin.execute("UPDATE inventory SET stock = 0 WHERE sku = $1", sku)
            await admin.execute(off_by_one())
            try:
                status, body = await buy(client, sku, "alice", "a1")
            finally:
                await admin.execute(FUNCTION.read_text())
        finally:
            await admin.close()
        assert (status, body["error"]) == (503, "unavailable"), body
        assert await db_state(database_url, sku) == (0, 0, 0)
        assert await redis_state(redis, key_prefix, sku) == (3, 0)
        metrics = await (await client.get("/metrics")).text()
        assert 'flashsale_flush_failures_total{reason="stock_guard"} 1.0' in metrics
        assert await client_metric(client, "flashsale_flush_failures_total") == 1
        assert "flashsale_fenced_out_total 0.0" in metrics
        assert await buy(client, sku, "alice", "a1") == (409, {"status": "sold_out"})
        assert await db_state(database_url, sku) == (0, 0, 0)
        assert await redis_state(redis, key_prefix, sku) == (0, 0)
