"""The reconciler decided against fakes (issue 39): it takes the Protocols of
``gateway.usecases.ports``, so a ledger and a counter in memory beside an order
book show what one pass does: stale reservations settled as confirmed when their
order exists and given back otherwise, drift repaired from the database (at
once under a lock, seen twice alike without one), and an idle sku left alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from gateway.domain.model import Order, SkuInfo, Strategy, Verdict
from gateway.domain.skus import SkuState
from gateway.domain.stock import Pending, StockLoad
from gateway.lock import LockLost
from gateway.usecases.catalog import Catalog
from gateway.usecases.reconciler import Reconciler
from testkit.polling import wait_for
from tests.unit.stock_fakes import SKU, TIMEOUT_S, Locks, Rebuilds, Redis, Tags

NOW = datetime(2030, 1, 1, tzinfo=UTC)


@dataclass
class Database:
    """The inventory rows and the orders; each sku's row starts active."""

    stock: dict[str, int] = field(default_factory=dict)
    orders_made: dict[str, Order] = field(default_factory=dict)
    active: set[str] = field(default_factory=set)
    idled: list[str] = field(default_factory=list)

    def add_sku(self, sku: str, stock: int) -> None:
        self.stock[sku] = stock
        self.active.add(sku)

    def commit(self, entry: Pending) -> None:
        """The order a flush committed for ``entry`` (its stock taken)."""
        self.orders_made[entry.request_id] = Order(
            f"o-{entry.request_id}", entry.request_id, SKU, entry.user_id, entry.qty
        )
        self.stock[SKU] -= entry.qty

    async def sku_info(self, sku: str) -> SkuInfo | None:
        return SkuInfo(sku, 1) if sku in self.stock else None

    async def stock_of(self, sku: str) -> int | None:
        return self.stock.get(sku)

    async def units_sold(self, sku: str) -> int:
        return sum(o.qty for o in self.orders_made.values() if o.sku == sku)

    async def orders(self, request_ids: Sequence[str]) -> dict[str, Order]:
        return {r: self.orders_made[r] for r in request_ids if r in self.orders_made}

    async def release_stale(self, sku: str, stale: Sequence[tuple[str, int]]) -> dict[str, Order]:
        return await self.orders([rid for rid, _ in stale])

    async def stock_and_owed(self, sku: str) -> tuple[int, dict[str, int]] | None:
        return None if sku not in self.stock else (self.stock[sku], {})

    async def states(self, *, every: bool = False) -> list[SkuState]:
        return [
            SkuState(sku, stock, 0, 0, NOW, False, sku in self.active)
            for sku, stock in self.stock.items()
            if every or sku in self.active
        ]

    async def mark_idle(self, sku: str, updated_at: datetime) -> bool:
        self.active.discard(sku)
        self.idled.append(sku)
        return True

    async def mark_active(self, sku: str) -> None:
        self.active.add(sku)


class Orders:
    """The database as the order books' Protocol names its reads."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.units_sold = db.units_sold
        self.orders = db.orders
        self.release_stale = db.release_stale
        self.stock_and_owed = db.stock_and_owed

    async def stock(self, sku: str) -> int | None:
        return await self._db.stock_of(sku)


class Same:
    """Redis's state is this database's, and nothing is pruned."""

    async def adopt(self, identity: str) -> bool:
        return False

    async def read(self) -> str:
        return "db-1"

    async def prune(self) -> object:
        return None


class Observer:
    """The skus the metrics keep."""

    def __init__(self) -> None:
        self.kept: list[str] = []

    def sku_state(self, sku: str, pending: int, drift: int) -> None:
        pass

    def sale(self, state: SkuState) -> None:
        pass

    def retain(self, skus: Collection[str]) -> None:
        self.kept = list(skus)


@dataclass
class World:
    redis: Redis
    db: Database
    rebuilds: Rebuilds
    observer: Observer
    queued: set[str]

    def reconciler(self, *, locked: bool = True, locks: Locks | None = None) -> Reconciler:
        async def queued(sku: str) -> set[str]:
            return self.queued

        same = Same()
        return Reconciler(
            reservations=self.redis,
            orders=Orders(self.db),
            inventory=self.db,
            stamp=same,
            database=same,
            retention=same,
            locks=locks or Locks(enabled=locked),
            timeout_s=TIMEOUT_S,
            interval_s=3600.0,
            observer=self.observer,
            queued=queued,
            catalog=Catalog(self.db, Strategy.RESERVE_BATCH, Tags()),
            rebuilds=self.rebuilds,
        )


@pytest.fixture
def world() -> World:
    """A sku of 10 units on sale, its counter in step."""
    db = Database()
    db.add_sku(SKU, 10)
    redis = Redis(counters={SKU: 10})
    return World(redis, db, Rebuilds(), Observer(), set())


class TestStaleReservations:
    """Step 1: ledger entries older than the timeout are settled."""

    async def test_committed_is_confirmed_and_uncommitted_given_back(self, world: World) -> None:
        """A stale entry whose order exists leaves the ledger as confirmed (with
        its order id); one without an order gives its units back."""
        world.db.commit(world.redis.reserve("made"))
        world.redis.reserve("lost", 2)
        done = await world.reconciler().reconcile(SKU)
        verdicts = {s.request_id: (s.verdict, s.order_id) for s in world.redis.settled}
        assert verdicts == {"made": (Verdict.CONFIRMED, "o-made"), "lost": (Verdict.RELEASED, "")}
        assert (done.done.confirmed, done.done.released, done.done.pending) == (1, 1, 0)
        assert world.redis.counters[SKU] == world.db.stock[SKU] == 9
        assert (done.done.drift, done.quiet) == (0, False)

    async def test_fresh_and_queued_reservations_stay(self, world: World) -> None:
        """An entry younger than the timeout, or still in the queue strategy's
        stream however old, is left to its flush: it counts as pending."""
        world.redis.reserve("fresh", age_s=1.0)
        world.redis.reserve("queued")
        world.queued.add("queued")
        done = await world.reconciler().reconcile(SKU)
        assert world.redis.settled == []
        assert (done.done.pending, done.done.drift, done.done.repaired) == (2, 0, False)


class TestDrift:
    """Step 2: redis_stock + pending == db_stock, else repaired from PostgreSQL."""

    async def test_drift_is_repaired_from_the_database(self, world: World) -> None:
        """A counter Redis lost writes of is set from the database's stock
        (REPAIR), and the sku's hashes are rebuilt."""
        world.redis.counters[SKU] = 7
        done = await world.reconciler().reconcile(SKU)
        assert (done.done.drift, done.done.repaired) == (3, True)
        assert world.redis.loads == [(SKU, 10, StockLoad.REPAIR)]
        assert world.redis.counters[SKU] == 10
        assert world.rebuilds.started == [SKU]

    async def test_without_a_lock_drift_is_repaired_when_seen_twice_alike(
        self, world: World
    ) -> None:
        """Without a lock a drift may be a flush between its commit and its
        settle: the first pass only notes it, the second alike repairs it."""
        world.redis.counters[SKU] = 8
        reconciler = world.reconciler(locked=False)
        first = await reconciler.reconcile(SKU)
        assert (first.done.drift, first.done.repaired, world.redis.loads) == (2, False, [])
        second = await reconciler.reconcile(SKU)
        assert (second.done.drift, second.done.repaired) == (2, True)
        assert world.redis.counters[SKU] == 10


class TestIdleSkus:
    """A pass visits the active skus alone."""

    async def test_an_exhausted_quiet_sku_goes_idle_and_is_left_alone(self, world: World) -> None:
        """A sku with no stock and nothing pending or drifting is marked idle
        and leaves the metrics; the next pass does not visit it, nor touch Redis."""
        world.db.stock[SKU], world.redis.counters[SKU] = 0, 0
        reconciler = world.reconciler()
        assert SKU in await reconciler.reconcile_all()
        assert (world.db.idled, world.observer.kept) == ([SKU], [])
        world.redis.counters[SKU] = 5  # a pass would call this drift
        assert await reconciler.reconcile_all() == {}
        assert world.redis.loads == []

    async def test_a_sku_on_sale_stays_active(self, world: World) -> None:
        """Stock on sale keeps a sku active, in the passes and the metrics."""
        await world.reconciler().reconcile_all()
        assert (world.db.idled, world.observer.kept) == ([], [SKU])


class ReleaseFailsOnCancel(Locks):
    """A flush lock whose release fails when the pass inside it is cancelled (its
    Redis gone, as at a gateway's shutdown): the release's error takes the
    cancellation's place, as an ``async with`` whose exit raises does."""

    def __init__(self) -> None:
        super().__init__()
        self.entered: list[str] = []

    @asynccontextmanager
    async def held(self, sku: str) -> AsyncIterator[None]:
        self.entered.append(sku)
        try:
            yield
        except asyncio.CancelledError:
            raise LockLost(sku) from None


@dataclass
class Stalling(Redis):
    """Redis that never answers a ledger read: a pass waits inside the lock."""

    async def pending(self, sku: str) -> list[Pending]:
        await asyncio.Event().wait()
        return []


class TestStopping:
    """The reconciler's task stops when cancelled."""

    async def test_a_pass_cancelled_inside_a_lock_whose_release_fails_stops(self) -> None:
        """Two skus; the pass is cancelled while the first one's lock is held,
        and the lock's release fails in its place: the pass ends cancelled, and
        the second sku is not visited (it went on to it, and on pass after pass:
        a test gateway's reconciler was stuck for the 120 s of its teardown)."""
        db = Database()
        db.add_sku(SKU, 10)
        db.add_sku("sku-2", 10)
        world = World(Stalling(counters={SKU: 10, "sku-2": 10}), db, Rebuilds(), Observer(), set())
        locks = ReleaseFailsOnCancel()
        task = asyncio.create_task(world.reconciler(locks=locks).reconcile_all())
        await wait_for(lambda: bool(locks.entered), within=5, what="the first sku's pass")
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done and task.cancelled(), "the pass went on after its cancel"
        assert locks.entered == [SKU]
