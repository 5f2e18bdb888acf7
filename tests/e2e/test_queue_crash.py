"""The queue strategy's crash safety, with real gateway and writer processes.

A purchase answered 202 is in the sku's stream; from there a writer reads it,
commits it, settles Redis and acknowledges it. Each test kills a process at one
of those steps, at a point observed from outside (stream length, the group's
pending entries, a flush waiting on the inventory row lock that the test
holds), starts another, and checks that every 202 ends 200 or 409, nothing is
oversold or ordered twice, the database adds up, and Redis's ledger and the
stream are empty.
"""

from __future__ import annotations

import asyncio
import signal

import asyncpg
import pytest
from redis.asyncio import Redis

from gateway.redis.layout import WRITERS_GROUP, stream_key
from testkit.driver import LoadDriver
from testkit.polling import wait_for
from testkit.queuestack import (
    accept,
    assert_books,
    asyncpg_fetchval,
    queue_stack,
    records_of,
    resolve,
)

# A flush_batch() call waiting for the inventory row lock the test holds.
WAITING_FLUSH = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%flush_batch%'
"""
ORDER_COUNT = "SELECT count(*) FROM orders WHERE sku = $1"


class TestKilledBeforeRead:
    """SIGKILL after XADD, before any writer read it."""

    async def test_accepted_purchases_survive_the_gateway(
        self, database_url: str, key_prefix: str, redis: Redis, sku: str
    ) -> None:
        """The accepting gateway dies with 20 purchases in the stream and no writer:
        a writer started afterwards commits every one of them, and stops with
        status 0 on SIGTERM."""
        async with queue_stack(database_url, key_prefix) as (cluster, writers):
            await cluster.put_sku(sku, 20)
            answers = await accept(cluster.urls[0], sku, [f"u{i}" for i in range(30)])
            assert sorted(s for s, _ in answers.values()) == [202] * 20 + [409] * 10
            await cluster[0].crash()
            assert await redis.xlen(stream_key(key_prefix, sku)) == 20
            writer = writers.start()
            await cluster[0].start()
            records = records_of(answers, sku)
            await resolve(cluster.urls[0], records)
            context = cluster.logs() + writers.logs()
            await assert_books(database_url, key_prefix, redis, sku, 20, records, context)
            await writer.stop()
            assert writer.returncode == 0, writers.logs()


class TestKilledMidBatch:
    """A writer stopped with a batch read and its flush waiting on the row lock,
    then SIGKILLed; its flush then never commits, or commits without the writer."""

    @pytest.mark.parametrize("flush", ["never_commits", "commits_after_death"])
    async def test_another_writer_claims_the_batch(
        self, database_url: str, key_prefix: str, redis: Redis, sku: str, flush: str
    ) -> None:
        """Whether the dead writer's transaction was cut off before its commit or
        committed with nobody left to settle and acknowledge it, the writer
        started next claims the entries and every purchase ends confirmed once."""
        async with queue_stack(database_url, key_prefix) as (cluster, writers):
            await cluster.put_sku(sku, 20)
            answers = await accept(cluster.urls[0], sku, [f"u{i}" for i in range(20)])
            assert {s for s, _ in answers.values()} == {202}
            con = await asyncpg.connect(database_url)
            try:
                tx = con.transaction()
                await tx.start()
                await con.execute("SELECT 1 FROM inventory WHERE sku = $1 FOR UPDATE", sku)
                first = writers.start()
                key = stream_key(key_prefix, sku)

                async def batch_in_hand() -> int | None:
                    pending = (await redis.xpending(key, WRITERS_GROUP))["pending"]
                    if not pending:
                        return None
                    # Not on the connection holding the transaction: its view of
                    # pg_stat_activity is a snapshot kept until the transaction ends.
                    backend: int | None = await asyncpg_fetchval(database_url, WAITING_FLUSH)
                    return backend

                backend = await wait_for(batch_in_hand, within=30, what="a flush on the lock")
                first.send(signal.SIGSTOP)  # frozen with the batch read, not acknowledged
                await first.kill()
                if flush == "never_commits":
                    await con.execute("SELECT pg_terminate_backend($1)", backend)
                await tx.rollback()
                if flush == "commits_after_death":

                    async def committed() -> bool:
                        return bool(await con.fetchval(ORDER_COUNT, sku))

                    await wait_for(committed, within=10, what="the dead writer's commit")
                writers.start()
                records = records_of(answers, sku)
                await resolve(cluster.urls[0], records)
            finally:
                await con.close()
            context = cluster.logs() + writers.logs()
            await assert_books(database_url, key_prefix, redis, sku, 20, records, context)


class TestKilledUnderLoad:
    """Gateways with their own writers SIGKILLed repeatedly in a storm."""

    async def test_three_kills_lose_and_duplicate_nothing(
        self, database_url: str, key_prefix: str, redis: Redis, sku: str
    ) -> None:
        """400 buyers, arriving over 8 s, for 100 units through two gateways; gateway 0 is SIGKILLed
        and restarted as 10, 40 and 70 orders are committed. Every buyer ends 200
        or 409, exactly the stock is sold, to distinct buyers, once each."""
        stack = queue_stack(database_url, key_prefix, gateways=2, in_process_writer=True)
        async with stack as (cluster, _):
            await cluster.put_sku(sku, 100)
            driver = LoadDriver(cluster.urls, sku, users=400, start_spread_s=8.0, seed=12)
            sale = asyncio.create_task(driver.run())
            mid_sale = 0
            con = await asyncpg.connect(database_url)
            try:
                for orders in (10, 40, 70):

                    async def reached(n: int = orders) -> bool:
                        return await con.fetchval(ORDER_COUNT, sku) >= n or sale.done()

                    await wait_for(reached, within=60, what=f"{orders} orders")
                    mid_sale += not sale.done()
                    await cluster[0].restart()
            finally:
                await con.close()
            summary = await sale
            assert mid_sale >= 2, "the sale ended before the kills"
            accepted = [r for r in summary.records if r.status == 202]
            await resolve(cluster.urls[1], accepted)
            context = cluster.logs()
            await assert_books(database_url, key_prefix, redis, sku, 100, summary.records, context)
            assert len(cluster[0].log_text().split("----- chaos: start #")) == 5
