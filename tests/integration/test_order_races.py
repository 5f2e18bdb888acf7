"""Pay against expire around the deadline, and the faults between PostgreSQL's
commit and Redis's return (issue 31), on real Redis and PostgreSQL.

The races run concurrently: 1,000 orders whose deadlines fall just before, at
and just after their payments, while three sweeps run (the gateway's and two
more), each ending in exactly one terminal state that matches what its payer
was told, and the books holding."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis
from structlog.testing import capture_logs

from gateway.domain.errors import OrderExpired
from gateway.domain.model import Cause, Order, Strategy
from gateway.http.appkeys import LIFECYCLE, ORDERS, RECONCILER, REDIS, RESERVATIONS
from gateway.ops.audit import Finding, audit
from gateway.ops.lifecycle_metrics import LifecycleMetrics
from gateway.postgres.inventory import Inventory
from gateway.postgres.lifecycle import Lifecycle
from gateway.redis.connections import create_redis
from gateway.redis.layout import KeyTags, SkuKeys
from gateway.redis.reservations import Reservations
from gateway.redis.rooms import Rooms
from gateway.settings import Settings
from gateway.usecases.catalog import Catalog
from gateway.usecases.lifecycle import OrderLifecycle
from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS, Client, buy

PAYMENT_TOKEN = "test-payment-token"
PAY_HEADERS = {"Authorization": f"Bearer {PAYMENT_TOKEN}"}
RACES = 1000
# Deadlines from a second before the payments start to three seconds after, the
# payments over their first two seconds: before, at and after, about half paid.
# A loaded run's test process (its heap, the in-process gateway's) paused for
# over a second at once (a core burned): with deadlines at most a second ahead,
# every payment came after every deadline.
SPREAD_MS = 1000


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool of the test's own, as a second gateway's would be."""
    created = await asyncpg.create_pool(database_url, min_size=4, max_size=24)
    try:
        yield created
    finally:
        await created.close()


@pytest.fixture
async def lifecycle(
    pool: asyncpg.Pool, make_settings: Callable[..., Settings]
) -> AsyncIterator[OrderLifecycle]:
    """The use case as another gateway runs it, on its own pool and Redis client."""
    settings = make_settings()
    redis = create_redis(settings)
    try:
        book = Lifecycle(pool, Strategy.RESERVE_BATCH)
        yield OrderLifecycle(
            transitions=book,
            sweeps=book,
            listings=book,
            returns=Reservations(redis, settings),
            rooms=Rooms(redis, settings),
            catalog=Catalog(Inventory(pool), Strategy.RESERVE_BATCH, KeyTags()),
            metrics=LifecycleMetrics(CollectorRegistry()),
            sweep_s=0.05,
        )
    finally:
        await redis.aclose()


async def start(start_gateway: Any) -> Client:
    """A gateway that takes payments and sweeps every 50 ms."""
    client: Client = await start_gateway(payment_token=PAYMENT_TOKEN, expiry_sweep_s=0.05)
    return client


async def put_window(client: Client, sku: str, stock: int, window_s: int, strategy: str) -> None:
    """Create the sku with a payment window."""
    body = {"stock": stock, "payment_window_s": window_s, "strategy": strategy}
    resp = await client.put(f"/admin/skus/{sku}", json=body, headers=ADMIN_HEADERS)
    assert resp.status == 200, await resp.text()


async def sold_pending(pool: asyncpg.Pool, sku: str, n: int) -> list[str]:
    """``n`` orders of one unit each, sold as the purchases would (the stock
    taken, no movement), due from SPREAD_MS before now to 3 * SPREAD_MS after."""
    rids = [f"{sku}.race{i}" for i in range(n)]
    offsets = [random.randint(-SPREAD_MS, 3 * SPREAD_MS) for _ in range(n)]
    async with pool.acquire() as con, con.transaction():
        await con.execute("UPDATE inventory SET stock = stock - $2 WHERE sku = $1", sku, n)
        await con.execute(
            "INSERT INTO orders (request_id, sku, user_id, qty, status, pay_by)"
            " SELECT r, $1, 'u' || r, 1, 'pending_payment',"
            " clock_timestamp() + make_interval(secs => o / 1000.0)"
            " FROM unnest($2::text[], $3::int[]) AS t(r, o)",
            sku,
            rids,
            offsets,
        )
    return rids


async def sweeping(lifecycle: OrderLifecycle, stop: asyncio.Event) -> None:
    """Sweep back to back until told to stop."""
    while not stop.is_set():
        await lifecycle.sweep()
        await asyncio.sleep(0.005)


async def paid_or_expired(lifecycle: OrderLifecycle, rid: str) -> str:
    """Pay ``rid`` a moment from now: what its payer was told."""
    await asyncio.sleep(random.uniform(0, 2 * SPREAD_MS / 1000))
    try:
        order: Order = await lifecycle.pay(rid, f"pay-{rid}")
    except OrderExpired:
        return "expired"
    return str(order.status)


class TestPayAgainstExpire:
    """Exactly one of pay and expire wins each order, decided by PostgreSQL."""

    @pytest.mark.parametrize("strategy", ["reserve-batch", "sql-direct"])
    async def test_a_thousand_races_around_the_deadline(
        self,
        start_gateway: Any,
        sku: str,
        pool: asyncpg.Pool,
        lifecycle: OrderLifecycle,
        redis: Redis,
        key_prefix: str,
        make_settings: Callable[..., Settings],
        strategy: str,
    ) -> None:
        """1,000 payments race their deadlines and three sweeps: every order ends
        paid or expired, as its payer was told; each expired one is returned once
        (a movement, a unit in PostgreSQL and, reserving, in Redis) with its
        payment recorded for a refund; the paid ones keep their unit."""
        client = await start(start_gateway)
        await put_window(client, sku, RACES, 60, strategy)
        keys = SkuKeys.of(key_prefix, sku)
        await redis.set(keys.stock, 0)  # the sale's units all sold, as in PostgreSQL
        rids = await sold_pending(pool, sku, RACES)
        stop = asyncio.Event()
        sweeps = [asyncio.create_task(sweeping(lifecycle, stop)) for _ in range(2)]
        told = await asyncio.gather(*(paid_or_expired(lifecycle, rid) for rid in rids))
        stop.set()
        await asyncio.gather(*sweeps)

        rows = await pool.fetch(
            "SELECT o.request_id, o.status, o.payment_id, l.payment_id AS late"
            " FROM orders o LEFT JOIN late_payments l ON l.request_id = o.request_id"
            " WHERE o.sku = $1",
            sku,
        )
        final = {r["request_id"]: r for r in rows}
        for rid, answer in zip(rids, told, strict=True):
            row = final[rid]
            assert row["status"] == answer, rid
            if answer == "paid":
                assert (row["payment_id"], row["late"]) == (f"pay-{rid}", None)
            else:
                assert (row["payment_id"], row["late"]) == (None, f"pay-{rid}")
        expired = told.count("expired")
        assert 0 < expired < RACES, "the deadlines fell on both sides of the payments"
        stock = await pool.fetchval("SELECT stock FROM inventory WHERE sku = $1", sku)
        moved = await pool.fetchval(
            "SELECT count(*) FROM stock_movements WHERE sku = $1 AND reason = 'expired'", sku
        )
        assert (stock, moved) == (expired, expired)
        if strategy == "reserve-batch":

            async def all_given_back() -> bool:
                return await redis.get(keys.stock) == str(expired).encode()

            await wait_for(all_given_back, within=10, what="every return in Redis")
            assert await redis.hlen(keys.returned) == expired
        [books] = await audit(make_settings(), sku)
        assert (books.provided, books.db_stock, books.held, books.sold) == (
            RACES,
            expired,
            0,
            RACES - expired,
        )
        assert books.verdict is Finding.OK, books


class TestCommitThenRedis:
    """A return committed in PostgreSQL and not yet given to Redis is finished
    by a sweep, once, whatever happened in between."""

    async def test_a_crash_between_the_commit_and_redis(
        self,
        start_gateway: Any,
        sku: str,
        pool: asyncpg.Pool,
        lifecycle: OrderLifecycle,
        redis: Redis,
        key_prefix: str,
    ) -> None:
        """The cancel commits on a gateway that dies before telling Redis: the
        unit is owed (not counted as drift), then the sweep of the gateway left
        gives it back once; giving it again adds nothing."""
        client = await start(start_gateway)
        await put_window(client, sku, 2, 60, "reserve-batch")
        assert (await buy(client, sku, "ann", "a1"))[0] == 201
        keys = SkuKeys.of(key_prefix, sku)
        # The dying gateway's half: PostgreSQL's commit, and nothing more.
        closed = await Lifecycle(pool, Strategy.RESERVE_BATCH).cancel(
            f"{sku}.a1", None, Cause.BUYER
        )
        assert closed is not None and closed.owed
        assert await redis.get(keys.stock) == b"1"
        resp = await client.post("/admin/reconcile", headers=ADMIN_HEADERS)
        assert (await resp.json())[sku]["drift"] == 0

        async def given_back() -> bool:
            synced = await pool.fetchval(
                "SELECT synced_at IS NOT NULL FROM orders WHERE request_id = $1", f"{sku}.a1"
            )
            return bool(synced) and await redis.get(keys.stock) == b"2"

        await wait_for(given_back, within=10, what="the owed return given back")
        assert await client.app[RESERVATIONS].return_units(sku, [closed]) == 0
        assert await redis.get(keys.stock) == b"2"

    async def test_redis_loses_the_sale_while_units_are_held_and_owed(
        self,
        start_gateway: Any,
        sku: str,
        pool: asyncpg.Pool,
        redis: Redis,
        key_prefix: str,
        database_url: str,
    ) -> None:
        """Two units held, one return owed, and Redis loses the sale: the counter
        reloaded from PostgreSQL counts neither the held units nor the owed one
        until it is given; the held buyer is still a duplicate; each unit is
        sold once."""
        client = await start(start_gateway)
        await put_window(client, sku, 3, 60, "reserve-batch")
        for user in ("bea", "cal", "dot"):
            assert (await buy(client, sku, user, user))[0] == 201
        closed = await Lifecycle(pool, Strategy.RESERVE_BATCH).cancel(
            f"{sku}.dot", None, Cause.BUYER
        )
        assert closed is not None
        for key in await redis.keys(f"{key_prefix}:{{{sku}}}:*"):
            await redis.delete(key)
        # The reload counts what PostgreSQL has on sale less what is owed: 0.
        status, body = await buy(client, sku, "eve", "eve")
        assert status == 409 and body["status"] == "sold_out"
        status, body = await buy(client, sku, "bea", "bea2")
        assert status == 409 and body["status"] in ("duplicate", "sold_out")
        keys = SkuKeys.of(key_prefix, sku)

        async def given_back() -> bool:
            return await redis.get(keys.stock) == b"1"

        await wait_for(given_back, within=10, what="the owed return given back")
        storm = await asyncio.gather(*(buy(client, sku, f"n{i}", f"n{i}") for i in range(10)))
        assert sum(1 for s, _ in storm if s == 201) == 1
        stock = await pool.fetchval("SELECT stock FROM inventory WHERE sku = $1", sku)
        live = await pool.fetchval(
            "SELECT sum(qty) FROM orders WHERE sku = $1 AND status = 'pending_payment'", sku
        )
        assert (stock, live) == (0, 3)


class Interleaved(Lifecycle):
    """The real adapter, which runs ``between`` after the units went back to
    Redis and before it records that: where a reconcile pass could fall."""

    def __init__(self, pool: asyncpg.Pool, between: Callable[[], Awaitable[None]]) -> None:
        super().__init__(pool, Strategy.RESERVE_BATCH)
        self._between = between

    async def mark_synced(self, request_ids: Sequence[str]) -> None:
        """Run ``between``, then record the return."""
        await self._between()
        await super().mark_synced(request_ids)


class TestReturnAgainstReconcile:
    """A reconcile pass never takes a return for drift (issue 31's bench found it
    lowering the counter between a return to Redis and its record)."""

    async def test_a_pass_between_the_return_and_its_record(
        self,
        start_gateway: Any,
        sku: str,
        pool: asyncpg.Pool,
        make_settings: Callable[..., Settings],
        redis: Redis,
        key_prefix: str,
    ) -> None:
        """A pass run while a cancel is between giving the unit back to Redis
        and recording it sees no drift and leaves the counter alone: the unit
        stays on sale, no drift is logged, the books hold."""
        client = await start_gateway(payment_token=PAYMENT_TOKEN, reconcile_interval_s=3600)
        await put_window(client, sku, 2, 60, "reserve-batch")
        assert (await buy(client, sku, "ann", "a1"))[0] == 201
        reconciler, drifts = client.app[RECONCILER], []

        async def reconcile_between() -> None:
            drifts.append((await reconciler.reconcile(sku)).done.drift)

        settings = make_settings()
        book = Interleaved(pool, reconcile_between)
        cancelling = OrderLifecycle(
            transitions=book,
            sweeps=book,
            listings=book,
            returns=client.app[RESERVATIONS],
            rooms=Rooms(client.app[REDIS], settings),
            catalog=Catalog(Inventory(pool), Strategy.RESERVE_BATCH, KeyTags()),
            metrics=LifecycleMetrics(CollectorRegistry()),
            sweep_s=0.05,
        )
        with capture_logs() as logs:
            order = await cancelling.cancel(f"{sku}.a1", reason=None, cause=Cause.BUYER)
            resp = await client.post("/admin/reconcile", headers=ADMIN_HEADERS)
        assert order.status == "cancelled"
        assert drifts == [0]
        assert (await resp.json())[sku]["drift"] == 0
        assert not [e for e in logs if e["event"] == "drift_repaired"]
        assert await redis.get(SkuKeys.of(key_prefix, sku).stock) == b"2"
        [books] = await audit(settings, sku)
        assert books.verdict is Finding.OK, books

    async def test_a_return_given_while_the_pass_looks(
        self,
        start_gateway: Any,
        sku: str,
        make_settings: Callable[..., Settings],
        redis: Redis,
        key_prefix: str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A cancel given back and recorded whole between the pass's read of
        Redis and its read of PostgreSQL: the pass measures nothing for the sku
        rather than repair, and the next one finds the books even."""
        client = await start_gateway(payment_token=PAYMENT_TOKEN, reconcile_interval_s=3600)
        await put_window(client, sku, 2, 60, "reserve-batch")
        assert (await buy(client, sku, "ann", "a1"))[0] == 201
        orders, lifecycle = client.app[ORDERS], client.app[LIFECYCLE]
        read_stock, cancels = orders.stock, list[str]()

        async def stock_after_a_cancel(of: str) -> int | None:
            if not cancels:
                cancels.append(
                    (await lifecycle.cancel(f"{sku}.a1", reason=None, cause=Cause.BUYER)).status
                )
            stock: int | None = await read_stock(of)
            return stock

        monkeypatch.setattr(orders, "stock", stock_after_a_cancel)
        with capture_logs() as logs:
            found = await client.app[RECONCILER].reconcile(sku)
        monkeypatch.undo()
        assert cancels == ["cancelled"]
        assert (found.done.drift, found.done.repaired) == (0, False)
        assert not [e for e in logs if e["event"] == "drift_repaired"]
        assert await redis.get(SkuKeys.of(key_prefix, sku).stock) == b"2"
        assert (await client.app[RECONCILER].reconcile(sku)).done.drift == 0
        [books] = await audit(make_settings(), sku)
        assert books.verdict is Finding.OK, books

    async def test_a_return_whose_record_a_crash_cut_off_is_not_drift(
        self,
        start_gateway: Any,
        sku: str,
        pool: asyncpg.Pool,
        make_settings: Callable[..., Settings],
        redis: Redis,
        key_prefix: str,
    ) -> None:
        """A gateway gave the unit back to Redis and died before recording it:
        the pass counts it as on sale (no repair), and the sweep of the gateway
        left records it without giving it twice."""
        client = await start_gateway(payment_token=PAYMENT_TOKEN, reconcile_interval_s=3600)
        await put_window(client, sku, 2, 60, "reserve-batch")
        assert (await buy(client, sku, "ann", "a1"))[0] == 201
        closed = await Lifecycle(pool, Strategy.RESERVE_BATCH).cancel(
            f"{sku}.a1", None, Cause.BUYER
        )
        assert closed is not None and closed.owed
        assert await client.app[RESERVATIONS].return_units(sku, [closed]) == 1
        stock = SkuKeys.of(key_prefix, sku).stock
        with capture_logs() as logs:
            resp = await client.post("/admin/reconcile", headers=ADMIN_HEADERS)
        assert (await resp.json())[sku]["drift"] == 0
        assert not [e for e in logs if e["event"] == "drift_repaired"]
        assert await redis.get(stock) == b"2"

        async def recorded() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT synced_at IS NOT NULL FROM orders WHERE request_id = $1", f"{sku}.a1"
                )
            )

        await wait_for(recorded, within=10, what="the sweep recording the return")
        assert await redis.get(stock) == b"2"
        [books] = await audit(make_settings(), sku)
        assert books.verdict is Finding.OK, books
