"""Two flushes of one sku in flight (``gateway.write.flights``), on real Redis and PostgreSQL.

The test holds the sku's inventory row lock, so each flight's ``flush_batch()``
waits inside PostgreSQL and both are provably in flight at once; then it lets
them commit and lands them as the sku's lane does, oldest first.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from gateway.domain.errors import Unavailable
from gateway.domain.model import Outcome, Purchase, Result
from gateway.lock import LockStats, LockSubscriber, load_lock_scripts
from gateway.postgres.database import create_pool, migrate
from gateway.postgres.orders import BatchDecision, Orders
from gateway.redis.connections import create_redis
from gateway.redis.reservations import Reservations
from gateway.settings import Settings
from gateway.write.flights import Flights
from gateway.write.flusher import Flusher
from gateway.write.sku_locks import sku_locks
from testkit.polling import wait_for

# The flights' flush_batch() calls, waiting on the row lock the test holds,
# latest first.
WAITING_FLUSHES = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'
  AND query LIKE '%flush_batch(%' AND pid <> pg_backend_pid()
ORDER BY query_start DESC
"""


class GatedOrders(Orders):
    """Orders whose ``commit_batch`` of a gated request id waits for a signal
    before it sends its statement: that batch reaches PostgreSQL later."""

    def __init__(self, pool: asyncpg.Pool[Any]) -> None:
        super().__init__(pool)
        self.gates: dict[str, asyncio.Event] = {}

    async def commit_batch(
        self, sku: str, batch: Sequence[Purchase], fence: int | None
    ) -> BatchDecision:
        gate = self.gates.get(batch[0].request_id)
        if gate is not None:
            await gate.wait()
        return await super().commit_batch(sku, batch, fence)


@dataclass
class Rig:
    """The gateway's flush path as ``gateway.app`` wires it, with the Redis lock."""

    orders: GatedOrders
    reservations: Reservations
    flusher: Flusher
    flights: Flights
    database_url: str
    skus: list[str]

    async def sku(self, stock: int, per_user_limit: int = 1) -> str:
        """A new sku with ``stock`` units in PostgreSQL and Redis."""
        sku = f"flights-{uuid.uuid4().hex[:8]}"
        self.skus.append(sku)
        fields = {"stock": stock, "per_user_limit": per_user_limit}
        await self.orders.change_sku(sku, fields, create=True)
        await self.reservations.load_stock(sku, stock, reset=True, fresh=True)
        return sku

    async def reserve(self, sku: str, users: Sequence[str], qty: int = 1) -> list[Purchase]:
        """Reserve ``qty`` for each of ``users`` in Redis, as a purchase does."""
        info = await self.orders.sku_info(sku)
        assert info is not None
        reserved = []
        for user in users:
            purchase = Purchase(sku, user, qty, f"{sku}.{user}")
            reply = await self.reservations.reserve(purchase, info)
            assert reply.kind == "ok", (user, reply)
            reserved.append(Purchase(sku, user, qty, purchase.request_id, reply.reserved_at_ms))
        return reserved

    async def redis_state(self, sku: str) -> tuple[int | None, int]:
        """Redis stock and the number of ledger entries."""
        stock, pending = await self.reservations.snapshot(sku)
        return stock, len(pending)

    async def db_state(self, sku: str) -> tuple[int, int]:
        """Database stock and the number of orders."""
        con = await asyncpg.connect(self.database_url)
        try:
            stock = await con.fetchval("SELECT stock FROM inventory WHERE sku = $1", sku)
            orders = await con.fetchval("SELECT count(*) FROM orders WHERE sku = $1", sku)
        finally:
            await con.close()
        return stock, orders


@pytest.fixture
async def rig(make_settings: Callable[..., Settings], database_url: str) -> AsyncIterator[Rig]:
    """Flights over a Flusher with the Redis flush lock, on this test's prefix."""
    settings = make_settings()
    redis = create_redis(settings)
    pool = await create_pool(settings)
    async with pool.acquire() as con:
        await migrate(con)
    orders = GatedOrders(pool)
    reservations = Reservations(redis, settings)
    await reservations.load_scripts()
    await load_lock_scripts(redis)
    subscriber = LockSubscriber(redis)
    locks = sku_locks(settings, redis, pool, subscriber, LockStats())
    flusher = Flusher(reservations=reservations, orders=orders, locks=locks)
    rig = Rig(orders, reservations, flusher, Flights(flusher, orders), database_url, [])
    yield rig
    for sku in rig.skus:
        await flusher.idle(sku)
    await subscriber.aclose()
    await pool.close()
    await redis.aclose()


@pytest.fixture
async def row_holder(database_url: str) -> AsyncIterator[Callable[[str], Any]]:
    """Holds a sku's inventory row lock in a transaction of its own until the
    block ends; a second connection watches pg_stat_activity (inside the
    holder's transaction it would be one snapshot)."""
    holder, watcher = [await asyncpg.connect(database_url) for _ in range(2)]

    class Held:
        def __init__(self, sku: str) -> None:
            self.sku = sku
            self.transaction = holder.transaction()

        async def __aenter__(self) -> Held:
            await self.transaction.start()
            await holder.execute("SELECT 1 FROM inventory WHERE sku = $1 FOR UPDATE", self.sku)
            return self

        async def __aexit__(self, *exc: object) -> None:
            await self.transaction.commit()

        async def waiting(self, count: int) -> list[int]:
            """Wait until ``count`` flushes wait on the row; their pids, latest first."""

            async def pids() -> list[int] | None:
                rows = await watcher.fetch(WAITING_FLUSHES)
                return [r["pid"] for r in rows] if len(rows) == count else None

            found = await wait_for(pids, what=f"{count} flushes waiting on the row")
            assert found is not None
            return found

        async def cancel(self, pid: int) -> None:
            """Cancel one backend's statement, as a statement timeout would."""
            assert await watcher.fetchval("SELECT pg_cancel_backend($1)", pid)

    yield Held
    await holder.close()
    await watcher.close()


def confirmed(results: Sequence[Result | BaseException]) -> bool:
    return all(isinstance(r, Result) and r.outcome is Outcome.CONFIRMED for r in results)


class TestTwoFlightsOfASku:
    """The next batch's commit queues behind the last one's; each lands in order."""

    async def test_both_commit_and_redis_ends_exactly_at_the_database(
        self, rig: Rig, row_holder: Any
    ) -> None:
        """Two batches of three, both waiting inside PostgreSQL at once, then
        committed one behind the other: six orders, six units taken in both
        stores, an empty ledger, and the sku's lane may send again."""
        sku = await rig.sku(10)
        first = await rig.reserve(sku, ["a1", "a2", "a3"])
        second = await rig.reserve(sku, ["b1", "b2", "b3"])
        async with row_holder(sku) as held:
            flight_a = await rig.flights.send(sku, first)
            await held.waiting(1)
            flight_b = await rig.flights.send(sku, second)
            await held.waiting(2)
            assert not rig.flights.room(sku), "two in flight is the depth"
        assert confirmed(await rig.flights.land(flight_a))
        assert confirmed(await rig.flights.land(flight_b))
        assert await rig.db_state(sku) == (4, 6)
        assert await rig.redis_state(sku) == (4, 0)
        assert rig.flights.room(sku)

    async def test_a_failed_second_flight_gives_back_only_its_reservations(
        self, rig: Rig, row_holder: Any
    ) -> None:
        """The second flight's statement is cancelled while it waits behind the
        first: the first's three orders commit, the second's buyers are answered
        503 and their three units and buyer entries go back, so they can buy
        again."""
        sku = await rig.sku(10)
        first = await rig.reserve(sku, ["a1", "a2", "a3"])
        second = await rig.reserve(sku, ["b1", "b2", "b3"])
        async with row_holder(sku) as held:
            flight_a = await rig.flights.send(sku, first)
            await held.waiting(1)
            flight_b = await rig.flights.send(sku, second)
            latest, _ = await held.waiting(2)
            await held.cancel(latest)
            await asyncio.wait_for(asyncio.wait([flight_b.commit]), 10)
        assert confirmed(await rig.flights.land(flight_a))
        answers = await rig.flights.land(flight_b)
        assert all(isinstance(r, Unavailable) for r in answers), answers
        assert await rig.db_state(sku) == (7, 3)
        assert await rig.redis_state(sku) == (7, 0)
        again = await rig.reserve(sku, ["b1", "b2", "b3"])
        flight = await rig.flights.send(sku, again)
        assert confirmed(await rig.flights.land(flight))
        assert await rig.db_state(sku) == (4, 6)
        assert await rig.redis_state(sku) == (4, 0)

    async def test_a_short_batch_that_committed_last_but_lands_first_keeps_no_stock_back(
        self, rig: Rig
    ) -> None:
        """Redis runs 15 units ahead of a database stock of 5. The first flight
        (two purchases of 2) reaches PostgreSQL after the second (two of 1), so
        the second commits first and the first finds the database short: one
        order of 2, one refused, 1 unit left. Landed in the order sent, the
        first's settle must not count the second's already committed units as
        still pending (that would leave Redis at 0 until the reconciler): Redis
        ends at the database's 1."""
        sku = await rig.sku(5, per_user_limit=2)
        keys = rig.reservations.keys(sku)
        await rig.reservations.redis.set(keys.stock, 20)
        first = await rig.reserve(sku, ["a1", "a2"], qty=2)
        second = await rig.reserve(sku, ["b1", "b2"])
        gate = rig.orders.gates[first[0].request_id] = asyncio.Event()
        flight_a = await rig.flights.send(sku, first)
        flight_b = await rig.flights.send(sku, second)
        await asyncio.wait_for(asyncio.wait([flight_b.commit]), 10)
        gate.set()
        answers = await rig.flights.land(flight_a)
        assert [isinstance(r, Result) and r.outcome for r in answers] == [
            Outcome.CONFIRMED,
            Outcome.SOLD_OUT,
        ]
        assert not rig.flights.room(sku), "the ceiling waits for the other flight"
        assert confirmed(await rig.flights.land(flight_b))
        assert await rig.db_state(sku) == (1, 3)
        assert await rig.redis_state(sku) == (1, 0)
        assert rig.flights.room(sku)
