"""A failover to a standby that lost the last commits: on real servers.

A private primary and its streaming standby (``pg_basebackup -R``) are started once
for the module. The standby stops streaming before the primary's last purchases,
the primary dies, the standby is promoted, and a gateway with the same Redis is
pointed at it: the Redis state stamped by the primary's timeline is dropped and
reloaded, never answered from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from gateway.redis.layout import identity_key
from testkit.postgres_servers import PostgresCluster, PostgresStandby
from testkit.purchases import Client, buy, db_state, put_sku

STOCK = 10
KEPT = 3  # orders the standby replayed before it stopped streaming
LOST = 3  # orders only the primary committed


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[PostgresCluster, PostgresStandby]]:
    """A private primary and its streaming standby, each on its own free port and
    temp dir; started once for the module, stopped and removed after it."""
    primary = PostgresCluster()
    standby = PostgresStandby(primary)
    try:
        asyncio.run(primary.start())
        asyncio.run(standby.start())
        yield primary, standby
    finally:
        try:
            asyncio.run(standby.close())
        finally:
            asyncio.run(primary.close())


async def stamp(redis: Redis, key_prefix: str) -> list[str]:
    """The database identity the Redis state is stamped with, split into its parts."""
    raw = await redis.get(identity_key(key_prefix))
    assert isinstance(raw, bytes)
    return raw.decode().split(":")


async def order_ids(database_url: str, sku: str) -> set[str]:
    """Every order id the database has for ``sku``."""
    con = await asyncpg.connect(database_url, timeout=5)
    try:
        rows = await con.fetch("SELECT order_id::text FROM orders WHERE sku = $1", sku)
    finally:
        await con.close()
    return {row["order_id"] for row in rows}


async def has_row(client: Client, sku: str, rid: str, user: str, order_id: str) -> bool:
    """Whether ``GET /v1/orders/<request id>?user_id=<user>`` finds ``order_id``."""
    resp = await client.get(f"/v1/orders/{sku}.{rid}", params={"user_id": user})
    return resp.status == 200 and (await resp.json())["order_id"] == order_id


class TestPromotedStandby:
    """Redis state made with a primary is never answered from with its promoted standby."""

    async def test_a_standby_that_missed_the_last_orders(
        self,
        servers: tuple[PostgresCluster, PostgresStandby],
        start_gateway: Any,
        sku: str,
        redis: Redis,
        key_prefix: str,
    ) -> None:
        """Sell 3 the standby replays, stop it, sell 3 more, kill the primary and promote
        the standby. The stamp's timeline changes; the 3 kept orders replay as before;
        the 3 lost ones are never answered with the primary's order ids but bought
        anew; the gateway then sells exactly the standby's stock, and every order id
        it answered has its row."""
        primary, standby = servers
        url = await primary.create_database("flashsale")
        a = await start_gateway(database_url=url)
        await put_sku(a, sku, STOCK)
        kept = [await buy(a, sku, f"u{i}", f"r{i}") for i in range(KEPT)]
        await standby.wait_replayed()
        await standby.stop()
        lost = [await buy(a, sku, f"u{i}", f"r{i}") for i in range(KEPT, KEPT + LOST)]
        assert all(status == 201 for status, _ in kept + lost)
        await a.close()
        before = await stamp(redis, key_prefix)
        await primary.kill()

        await standby.start()
        await standby.promote()
        url = standby.url("flashsale")
        assert await db_state(url, sku) == (STOCK - KEPT, KEPT, KEPT)
        b = await start_gateway(database_url=url)
        after = await stamp(redis, key_prefix)
        print(f"stamp before failover {':'.join(before)}, after {':'.join(after)}")
        assert after[:2] == before[:2] and after[2] != before[2]

        answered: set[str] = set()
        for i, (_, first) in enumerate(kept):
            assert await buy(b, sku, f"u{i}", f"r{i}") == (201, first)
            answered.add(first["order_id"])
        for i, (_, phantom) in enumerate(lost, start=KEPT):
            status, body = await buy(b, sku, f"u{i}", f"r{i}")
            assert status == 201 and body["order_id"] != phantom["order_id"]
            assert await has_row(b, sku, f"r{i}", f"u{i}", body["order_id"])
            answered.add(body["order_id"])
        new_buyers = range(KEPT + LOST, STOCK + 2)
        for i in new_buyers:
            status, body = await buy(b, sku, f"u{i}", f"r{i}")
            if i < STOCK:
                assert status == 201 and await has_row(b, sku, f"r{i}", f"u{i}", body["order_id"])
                answered.add(body["order_id"])
            else:
                assert body == {"status": "sold_out"}
        assert await db_state(url, sku) == (0, STOCK, STOCK)
        assert await order_ids(url, sku) == answered
