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
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import asyncpg
import pytest
from redis.asyncio import Redis

from gateway.audit import audit
from gateway.layout import WRITERS_GROUP, SkuKeys, stream_key
from gateway.settings import Settings
from tests.support.driver import (
    CONFIRMED,
    ClientRecord,
    DriverSummary,
    LoadDriver,
)
from tests.support.gateways import REPO, GatewayCluster
from tests.support.invariants import check_invariants
from tests.support.polling import wait_for
from tests.support.processes import Child
from tests.support.services import REDIS_URL

QUEUE: dict[str, str | int | float] = {
    "strategy": "queue",
    "batch_max": 10,
    "writer_block_ms": 200,
    "writer_claim_idle_s": 1,
    "lock_lease_s": 1,
}
# A flush_batch() call waiting for the inventory row lock the test holds.
WAITING_FLUSH = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%flush_batch%'
"""
ORDER_COUNT = "SELECT count(*) FROM orders WHERE sku = $1"


async def asyncpg_fetchval(database_url: str, sql: str, *args: object) -> Any:
    """One value of one statement, on a connection of its own."""
    con = await asyncpg.connect(database_url)
    try:
        return await con.fetchval(sql, *args)
    finally:
        await con.close()


class Writers:
    """``python -m gateway writer`` processes of a cluster, logged beside its gateways."""

    def __init__(self, cluster: GatewayCluster) -> None:
        self._cluster = cluster
        self.children: list[Child] = []

    def start(self) -> Child:
        """Spawn one more writer."""
        index = len(self.children)
        argv = [sys.executable, "-m", "gateway", "writer"]
        child = Child(
            argv, self._cluster.dir / f"writer-{index}.log", cwd=REPO, env=self._cluster.env
        )
        child.spawn(banner=f"----- writer {index}")
        self.children.append(child)
        return child

    async def close(self) -> None:
        """Stop every writer."""
        await asyncio.gather(*(c.stop(within=5) for c in self.children))

    def logs(self) -> str:
        """Every writer's log tail."""
        return "\n".join(
            f"--- writer {i}\n{c.log_path.read_text(errors='replace')[-3000:]}"
            for i, c in enumerate(self.children)
            if c.log_path.exists()
        )


@asynccontextmanager
async def queue_stack(
    database_url: str, key_prefix: str, *, gateways: int = 1, in_process_writer: bool = False
) -> AsyncIterator[tuple[GatewayCluster, Writers]]:
    """Gateways of the queue strategy (with or without their own writer) and a
    set of writer processes, stopped at the end."""
    settings: dict[str, str | int | float] = {
        **QUEUE,
        "queue_writer": str(in_process_writer).lower(),
    }
    async with GatewayCluster(
        gateways,
        redis_url=REDIS_URL,
        database_url=database_url,
        key_prefix=key_prefix,
        settings=settings,
    ) as cluster:
        writers = Writers(cluster)
        try:
            yield cluster, writers
        finally:
            await writers.close()


async def accept(url: str, sku: str, users: Sequence[str]) -> dict[str, tuple[int, Any]]:
    """One purchase per user (request id ``<sku>.<user>``); status and body by user."""
    async with aiohttp.ClientSession() as http:

        async def one(user: str) -> tuple[int, Any]:
            body = {"sku": sku, "user_id": user, "request_id": f"{sku}.{user}"}
            async with http.post(f"{url}/v1/purchase", json=body) as resp:
                return resp.status, await resp.json()

        answers = await asyncio.gather(*(one(u) for u in users))
    return dict(zip(users, answers, strict=True))


async def resolve(url: str, records: Sequence[ClientRecord]) -> None:
    """Follow every record answered 202 to its final answer (``?wait=``), in place."""
    async with aiohttp.ClientSession() as http:

        async def one(record: ClientRecord) -> None:
            async def final() -> tuple[int, Any] | None:
                target = f"{url}/v1/orders/{record.request_id}"
                async with http.get(target, params={"wait": "5"}) as resp:
                    answer = resp.status, await resp.json()
                return None if answer[0] == 202 else answer

            status, body = await wait_for(final, within=60, what=f"{record.request_id} final")
            record.status, record.body = status, body
            if status == 200:
                record.outcome, record.order_id = CONFIRMED, body["order_id"]
            elif status == 409:
                record.outcome = body["status"]
            else:
                record.outcome = f"http_{status}"

        await asyncio.gather(*(one(r) for r in records if r.status == 202))


def records_of(answers: dict[str, tuple[int, Any]], sku: str) -> list[ClientRecord]:
    """Client records of :func:`accept`'s answers (409s final already)."""
    records = []
    for user, (status, body) in answers.items():
        record = ClientRecord(user, f"{sku}.{user}", 1, status=status, body=body)
        if status == 409:
            record.outcome = body["status"]
        records.append(record)
    return records


async def assert_books(
    database_url: str,
    key_prefix: str,
    redis: Redis,
    sku: str,
    stock: int,
    records: list[ClientRecord],
    context: str,
) -> None:
    """Every client final, the invariants hold, Redis's ledger and stream are
    empty, and the audit is clean."""
    summary = DriverSummary(sku, records, 0.0)
    unresolved = [r.request_id for r in records if not r.final or r.outcome.startswith("http")]
    assert not unresolved, f"not 200 or 409: {unresolved[:5]}\n{context}"
    report = await check_invariants(database_url, sku, stock, summary, scenario="queue")
    assert report.ok, f"{report}\n{context}"
    assert report.sold == stock

    async def quiet() -> bool:
        return await redis.hlen(SkuKeys.of(key_prefix, sku).pending) == 0

    await wait_for(quiet, within=30, what="an empty ledger")
    assert await redis.xlen(stream_key(key_prefix, sku)) == 0
    settings = Settings(redis_url=REDIS_URL, database_url=database_url, key_prefix=key_prefix)
    assert [r.verdict for r in await audit(settings, sku)] == ["ok"]


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
