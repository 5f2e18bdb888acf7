"""Redis state has a lifetime, and belongs to one database: on real Redis and PostgreSQL.

A sku's keys expire after ``GATEWAY_SALE_RETENTION_S``; PostgreSQL answers, and
refills them, after. The rows traffic writes in PostgreSQL are pruned once they
can no longer matter (``tests/integration/test_soak.py`` checks every table and
key at once). State stamped by another database (here: one restored from a
dump taken mid-sale) is dropped and reloaded, never answered from.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from redis.asyncio import Redis

from gateway.postgres.retention import Retention
from gateway.redis.layout import SkuKeys, identity_key
from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS, buy, db_state, put_sku
from testkit.services import create_database, drop_database


async def run(*command: str) -> None:
    """Run a command line tool, failing the test with its output if it fails."""
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, output.decode(errors="replace")


async def _wait_expired(redis: Redis, keys: SkuKeys) -> None:
    """Wait until every key of the sale has expired (a 1 s retention here)."""

    async def expired() -> bool:
        return await redis.exists(*keys.all()) == 0

    await wait_for(expired, within=10, what="the sale's keys expire")


class TestRetention:
    """A sale's keys expire, and its answers stay right."""

    async def test_every_key_of_a_sku_carries_the_retention(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str
    ) -> None:
        """After a reservation and its settle all four keys expire within the retention."""
        client = await start_gateway(sale_retention_s=600)
        await put_sku(client, sku, 2)
        assert (await buy(client, sku, "fay", "r1"))[0] == 201
        keys = SkuKeys.of(key_prefix, sku)
        for key in (keys.stock, keys.buyers, keys.done):
            assert 0 < await redis.pttl(key) <= 600_000, key

    async def test_after_expiry_replays_duplicates_and_mismatches_are_still_answered(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str, database_url: str
    ) -> None:
        """With a 1 s retention the sale's keys vanish; then the replay still gets its
        order, the same buyer is still a duplicate, another payload is still a 422,
        and the unit left still sells exactly once."""
        client = await start_gateway(sale_retention_s=1.0)
        await put_sku(client, sku, 2)
        status, first = await buy(client, sku, "fay", "r1")
        assert status == 201
        await _wait_expired(redis, SkuKeys.of(key_prefix, sku))
        assert await buy(client, sku, "fay", "r1") == (201, first)
        assert await buy(client, sku, "fay", "r2") == (409, {"status": "duplicate"})
        status, body = await buy(client, sku, "gus", "r1")
        assert (status, body["error"]) == (422, "idempotency_mismatch")
        assert (await buy(client, sku, "gus", "r3"))[0] == 201
        assert (await buy(client, sku, "hal", "r4"))[1] == {"status": "sold_out"}
        assert await db_state(database_url, sku) == (0, 2, 2)

    async def test_a_restock_after_expiry_brings_the_buyers_back(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str, database_url: str
    ) -> None:
        """The sale sells out and its keys expire; a restock puts stock back. A replay
        of the first order still gets that order, its buyer is still a duplicate,
        and the new unit goes to a new buyer."""
        client = await start_gateway(sale_retention_s=1.0)
        await put_sku(client, sku, 1)
        status, first = await buy(client, sku, "fay", "r1")
        assert status == 201
        await _wait_expired(redis, SkuKeys.of(key_prefix, sku))
        resp = await client.post(
            f"/admin/skus/{sku}/restock", json={"delta": 1}, headers=ADMIN_HEADERS
        )
        assert resp.status == 200, await resp.text()
        assert await buy(client, sku, "fay", "r1") == (201, first)
        assert await buy(client, sku, "fay", "r2") == (409, {"status": "duplicate"})
        assert (await buy(client, sku, "gus", "r3"))[0] == 201
        assert await db_state(database_url, sku) == (0, 2, 2)


class TestAnotherDatabase:
    """Redis state made with one database is never answered from with another."""

    async def test_a_database_restored_from_a_mid_sale_dump(
        self, start_gateway: Any, sku: str, redis: Redis, key_prefix: str, tmp_path: Path
    ) -> None:
        """Sell 3, dump, sell 3 more, then serve from the restored dump with the same
        Redis: the 3 orders the dump has replay as before; the 3 it lacks are not
        answered with order ids that have no row, but bought anew, and every order id
        the gateway answers has its row."""
        names = [f"flashsale_restore_{uuid.uuid4().hex[:8]}_{side}" for side in "ab"]
        url_a = await create_database(names[0])
        dump = tmp_path / "mid-sale.dump"
        try:
            a = await start_gateway(database_url=url_a)
            await put_sku(a, sku, 10)
            before = [await buy(a, sku, f"u{i}", f"r{i}") for i in range(3)]
            await run("pg_dump", "--format=custom", f"--file={dump}", url_a)
            after = [await buy(a, sku, f"u{i}", f"r{i}") for i in range(3, 6)]
            assert all(status == 201 for status, _ in before + after)
            await a.close()
            url_b = await create_database(names[1])
            await run("pg_restore", f"--dbname={url_b}", str(dump))
            stamp_a = await redis.get(identity_key(key_prefix))
            b = await start_gateway(database_url=url_b)
            assert await redis.get(identity_key(key_prefix)) != stamp_a
            for i, (_, first) in enumerate(before):
                assert await buy(b, sku, f"u{i}", f"r{i}") == (201, first)
            for i, (_, phantom) in enumerate(after, start=3):
                status, body = await buy(b, sku, f"u{i}", f"r{i}")
                assert status == 201 and body["order_id"] != phantom["order_id"]
                row = await b.get(f"/v1/orders/{sku}.r{i}", params={"user_id": f"u{i}"})
                assert (await row.json())["order_id"] == body["order_id"]
            assert await db_state(url_b, sku) == (4, 6, 6)
            await b.close()
        finally:
            for name in names:
                await drop_database(name)


class TestPruning:
    """The reconciler's pruning pass deletes only what can no longer matter."""

    async def test_a_release_is_kept_for_its_retention_and_a_full_bucket_goes(
        self, con: asyncpg.Connection, database_url: str, sku: str
    ) -> None:
        """A release made within GATEWAY_RELEASE_RETENTION_S (an hour here) stays,
        and a flush still carrying its reservation is answered expired; one made
        earlier is deleted. A rate bucket past its expiry (full again) goes, one
        still filling stays."""
        await con.execute("INSERT INTO inventory (sku, stock) VALUES ($1, 5)", sku)
        await con.execute(
            "INSERT INTO released_reservations (request_id, reserved_at_ms, released_at)"
            " VALUES ($1, 42, now() - interval '59 minutes'),"
            " ($2, 42, now() - interval '61 minutes')",
            f"{sku}.recent",
            f"{sku}.old",
        )
        await con.execute(
            "INSERT INTO rate_buckets (sku, bucket, tokens, at, expires_at)"
            " VALUES ($1, 'u:full', 0, now(), now() - interval '1 second'),"
            " ($1, 'u:filling', 0, now(), now() + interval '1 minute')",
            sku,
        )
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
        try:
            pruned = await Retention(pool, release_retention_s=3600).prune()
        finally:
            await pool.close()
        assert pruned.released_reservations >= 1 and pruned.rate_buckets >= 1
        released = await con.fetch(
            "SELECT request_id FROM released_reservations WHERE request_id LIKE $1", f"{sku}.%"
        )
        assert [r["request_id"] for r in released] == [f"{sku}.recent"]
        buckets = await con.fetch("SELECT bucket FROM rate_buckets WHERE sku = $1", sku)
        assert [r["bucket"] for r in buckets] == ["u:filling"]
        (row,) = await con.fetch(
            "SELECT verdict FROM flush_batch($1, $2, $3, $4, $5, NULL, 2)",
            sku,
            [f"{sku}.recent"],
            ["late"],
            [1],
            [42],
        )
        assert row["verdict"] == "X"
