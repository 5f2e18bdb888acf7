"""Redis loses a sale's keys: no purchase waits for the rebuild, on real Redis and
PostgreSQL.

The rebuild of the buyers and done hashes runs once across the fleet, under a
lease (``lua/rebuild.lua``). Here the test plays the other instance that took
the lease and stalled, so the gateway under test answers while the hashes are
certainly incomplete; then the lease runs out and the gateway takes it over.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from gateway.domain.stock import StockLoad
from gateway.redis.connections import create_redis
from gateway.redis.layout import SkuKeys
from gateway.redis.rebuild_lease import RebuildLease
from gateway.redis.reservations import Reservations
from gateway.settings import Settings
from testkit.polling import wait_for
from testkit.purchases import buy, db_state, put_sku, redis_state

BIG_SALE = 100_000
# The lease of the instance the test plays: long enough never to run out by itself.
STALLED_MS = 600_000
# The gateway's rebuild unpaced (GATEWAY_REBUILD_SHARE): the takeover writes the
# whole sale back as fast as PostgreSQL and Redis go.
UNPACED = 1.0
# Replays and new buyers sent at once while the sale is rebuilt.
AT_ONCE = 100
# Units left of a big sale still in stock when it is lost.
LEFT = 1000


@dataclass(frozen=True)
class Other:
    """The Redis adapters of another gateway instance, played by the test."""

    reservations: Reservations
    lease: RebuildLease


@pytest.fixture
async def other(make_settings: Callable[..., Settings]) -> AsyncIterator[Other]:
    """Another gateway instance's Redis adapters, their scripts loaded."""
    settings = make_settings()
    client = create_redis(settings)
    found = Other(Reservations(client, settings), RebuildLease(client, settings))
    await found.reservations.load_scripts()
    await found.lease.load_scripts()
    yield found
    await client.aclose()


async def write_orders(database_url: str, sku: str, count: int, stock: int) -> None:
    """``count`` orders of ``sku`` (request id ``<sku>.r<i>``, buyer ``u<i>``)
    written straight into PostgreSQL, one statement, and the stock left."""
    con = await asyncpg.connect(database_url)
    try:
        await con.execute(
            "INSERT INTO orders (request_id, sku, user_id, qty)"
            " SELECT $1 || '.r' || i, $1, 'u' || i, 1 FROM generate_series(1, $2) AS i",
            sku,
            count,
        )
        await con.execute("UPDATE inventory SET stock = $2 WHERE sku = $1", sku, stock)
    finally:
        await con.close()


async def order_ids(database_url: str, request_ids: list[str]) -> dict[str, str]:
    """The order ids PostgreSQL holds for ``request_ids``, by request id."""
    con = await asyncpg.connect(database_url)
    try:
        rows = await con.fetch(
            "SELECT request_id, order_id::text FROM orders WHERE request_id = ANY($1)", request_ids
        )
        return {row[0]: row[1] for row in rows}
    finally:
        await con.close()


async def lose_sale(redis: Redis, keys: SkuKeys) -> None:
    """Redis loses every key of the sale (a restart without persistence)."""
    # A sku created now has nothing to rebuild: never flagged.
    assert await _absent(redis, keys.rebuild)
    await redis.delete(keys.stock, keys.buyers, keys.pending, keys.done, keys.rebuild)


async def _absent(redis: Redis, key: str) -> bool:
    return await redis.exists(key) == 0


async def stall_rebuild(other: Other, sku: str, db_stock: int) -> None:
    """Another instance found the counter missing first, reloaded it (flagging
    the sku as rebuilding) and took the rebuild's lease, then stalled."""
    await other.reservations.load_stock(sku, db_stock, StockLoad.RELOAD)
    assert await other.lease.take(sku, "stalled", STALLED_MS)


async def held_by(redis: Redis, keys: SkuKeys) -> str | None:
    """Who holds the sku's rebuild lease (None: not rebuilding)."""
    raw = await redis.get(keys.rebuild)
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else raw
    return text.partition("|")[0]


async def take_over(client: Any, redis: Redis, other: Other, sku: str, keys: SkuKeys) -> None:
    """The stalled instance's lease runs out; the next purchase that ``client``'s
    gateway asks Redis about takes the rebuild over, and it ends with both
    hashes whole."""
    assert await other.lease.take(sku, "stalled", 1)
    await wait_for(
        lambda: _taken_over(client, redis, sku, keys), within=30, what="the gateway takes over"
    )
    await wait_for(lambda: _absent(redis, keys.rebuild), within=60, what="the rebuild ends")


async def _taken_over(client: Any, redis: Redis, sku: str, keys: SkuKeys) -> bool:
    await buy(client, sku, "nudge", "nudge")
    return await held_by(redis, keys) not in ("stalled", "")


class TestSoldOutSaleLost:
    """A sold-out sale of 100,000 orders loses its keys."""

    async def test_answered_from_postgresql_while_the_rebuild_runs(
        self,
        start_gateway: Any,
        sku: str,
        redis: Redis,
        key_prefix: str,
        events_db: str,
        other: Other,
    ) -> None:
        """While another instance holds the rebuild (the hashes still empty), the
        next purchase is sold out and the sku is then known sold out here: a
        replay gets its order, another payload a 422, a repeat buyer with a new
        request id is sold out (as on any sold-out sku), and 100 replays sent at
        once with 100 new buyers get their own orders and sold out; this
        gateway does not rebuild the sale a second time. Once the lease runs
        out another gateway takes the rebuild over, which writes every order
        back: the replay is then answered from Redis."""
        client = await start_gateway(database_url=events_db, rebuild_share=UNPACED)
        keys = SkuKeys.of(key_prefix, sku)
        await put_sku(client, sku, 0)
        await write_orders(events_db, sku, BIG_SALE, 0)
        await lose_sale(redis, keys)
        await stall_rebuild(other, sku, 0)
        ids = [f"{sku}.r{i}" for i in range(1, AT_ONCE + 1)]
        orders = await order_ids(events_db, ids)
        first = orders[f"{sku}.r1"]

        assert await buy(client, sku, "late") == (409, {"status": "sold_out"})
        status, replay = await buy(client, sku, "u1", "r1")
        assert (status, replay["order_id"]) == (201, first)
        assert await buy(client, sku, "u2", "again") == (409, {"status": "sold_out"})
        status, body = await buy(client, sku, "someone", "r3")
        assert (status, body["error"]) == (422, "idempotency_mismatch")
        answers = await asyncio.gather(
            *(buy(client, sku, f"u{i}", f"r{i}") for i in range(1, AT_ONCE + 1)),
            *(buy(client, sku, f"new{i}", f"new{i}") for i in range(AT_ONCE)),
        )
        assert [(s, b["order_id"]) for s, b in answers[:AT_ONCE]] == [(201, orders[i]) for i in ids]
        assert answers[AT_ONCE:] == [(409, {"status": "sold_out"})] * AT_ONCE
        # The answers came while the sale was still being rebuilt, by the other instance.
        assert await held_by(redis, keys) == "stalled"
        assert await redis.hlen(keys.done) == 0

        # This gateway answers the sku in-process now; another of the fleet, which
        # asks Redis, finds the lease run out.
        fleet = await start_gateway(database_url=events_db, rebuild_share=UNPACED)
        await take_over(fleet, redis, other, sku, keys)
        assert await redis.hlen(keys.done) == await redis.hlen(keys.buyers) == BIG_SALE
        status, replay = await buy(client, sku, "u1", "r1")
        assert (status, replay["order_id"]) == (201, first)
        assert await db_state(events_db, sku) == (0, BIG_SALE, BIG_SALE)


class TestInStockSaleLost:
    """A sale still in stock loses its keys mid-sale."""

    async def test_no_oversell_no_second_order_replays_answered(
        self,
        start_gateway: Any,
        sku: str,
        redis: Redis,
        key_prefix: str,
        database_url: str,
        other: Other,
    ) -> None:
        """30 units, 10 sold, then the keys vanish and another instance holds the
        rebuild. At once: the 10 buyers again with new request ids, their 10
        replays, and 40 new buyers (5 of them twice). Every earlier buyer is a
        duplicate, every replay gets its own order, exactly the 20 units left are
        sold, to 20 buyers, nothing is sold twice; after the takeover Redis
        agrees with the database."""
        client = await start_gateway(rebuild_share=UNPACED)
        keys = SkuKeys.of(key_prefix, sku)
        await put_sku(client, sku, 30)
        sold = [await buy(client, sku, f"old{i}", f"old{i}") for i in range(10)]
        assert all(status == 201 for status, _ in sold)
        await lose_sale(redis, keys)
        await stall_rebuild(other, sku, 20)

        repeat = [buy(client, sku, f"old{i}", f"again{i}") for i in range(10)]
        replays = [buy(client, sku, f"old{i}", f"old{i}") for i in range(10)]
        new = [
            buy(client, sku, f"new{i}", f"new{i}-{n}")
            for i in range(40)
            for n in range(2 if i < 5 else 1)
        ]
        results = await asyncio.gather(*repeat, *replays, *new)

        assert results[:10] == [(409, {"status": "duplicate"})] * 10
        assert results[10:20] == sold
        statuses = collections.Counter(status for status, _ in results[20:])
        assert statuses == {201: 20, 409: 25}, statuses
        assert await held_by(redis, keys) == "stalled"
        assert await db_state(database_url, sku) == (0, 30, 30)

        await take_over(client, redis, other, sku, keys)
        assert await redis.hlen(keys.done) == await redis.hlen(keys.buyers) == 30
        assert await redis_state(redis, key_prefix, sku) == (0, 0)

    async def test_many_new_buyers_at_once_checked_in_postgresql(
        self,
        start_gateway: Any,
        sku: str,
        redis: Redis,
        key_prefix: str,
        events_db: str,
        other: Other,
    ) -> None:
        """A sale of 100,000 orders with 1,000 units left loses its keys and
        another instance holds the rebuild (the hashes empty). At once: 100 new
        buyers, one of them twice with two request ids, an earlier buyer with a
        new request id, and an earlier buyer's replay (checked against
        PostgreSQL together); then a second wave alike. Each new buyer gets one
        order, an earlier buyer is a duplicate, a replay gets its order; exactly
        200 units more are sold."""
        client = await start_gateway(database_url=events_db, rebuild_share=UNPACED)
        keys = SkuKeys.of(key_prefix, sku)
        await put_sku(client, sku, LEFT)
        await write_orders(events_db, sku, BIG_SALE, LEFT)
        await lose_sale(redis, keys)
        await stall_rebuild(other, sku, LEFT)
        earlier = await order_ids(events_db, [f"{sku}.r2", f"{sku}.r4"])

        answers = await asyncio.gather(
            *(buy(client, sku, f"new{i}", f"new{i}") for i in range(AT_ONCE)),
            buy(client, sku, "new0", "new0-again"),
            buy(client, sku, "u1", "again"),
            buy(client, sku, "u2", "r2"),
        )
        twice = [answers[0], answers[AT_ONCE]]  # new0's two request ids
        new, repeat, replay = answers[1:AT_ONCE], answers[-2], answers[-1]

        assert [status for status, _ in new] == [201] * (AT_ONCE - 1)
        assert sorted(status for status, _ in twice) == [201, 409]
        assert (409, {"status": "duplicate"}) in twice
        assert repeat == (409, {"status": "duplicate"})
        assert (replay[0], replay[1]["order_id"]) == (201, earlier[f"{sku}.r2"])
        # A second wave, which this gateway checks in PostgreSQL before its one
        # reserve.lua call (it knows the sku is rebuilt): new buyers, one of the
        # first wave again, an earlier buyer again, a replay of each kind.
        new6 = answers[6][1]["order_id"]
        answers = await asyncio.gather(
            *(buy(client, sku, f"next{i}", f"next{i}") for i in range(AT_ONCE)),
            buy(client, sku, "new5", "new5-again"),
            buy(client, sku, "u3", "again"),
            buy(client, sku, "u4", "r4"),
            buy(client, sku, "new6", "new6"),
        )
        assert [status for status, _ in answers[:AT_ONCE]] == [201] * AT_ONCE
        assert answers[AT_ONCE : AT_ONCE + 2] == [(409, {"status": "duplicate"})] * 2
        replays = [(status, body["order_id"]) for status, body in answers[-2:]]
        assert replays == [(201, earlier[f"{sku}.r4"]), (201, new6)]

        assert await held_by(redis, keys) == "stalled"
        sold = BIG_SALE + 2 * AT_ONCE
        assert await db_state(events_db, sku) == (LEFT - 2 * AT_ONCE, sold, sold)
