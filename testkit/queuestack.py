"""A queue-strategy stack of real processes for crash tests: gateways and
``python -m gateway writer`` processes on one database and Redis prefix, purchases
accepted (202) and then followed to their end, and the books checked after.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import asyncpg
from redis.asyncio import Redis

from gateway.ops.audit import audit
from gateway.redis.layout import SkuKeys, stream_key
from gateway.settings import Settings
from testkit.driver import CONFIRMED, ClientRecord, DriverSummary
from testkit.gateways import REPO, GatewayCluster
from testkit.invariants import check_invariants
from testkit.polling import wait_for
from testkit.processes import Child
from testkit.services import REDIS_URL

QUEUE: dict[str, str | int | float] = {
    "strategy": "queue",
    "batch_max": 10,
    "writer_block_ms": 200,
    "writer_claim_idle_s": 1,
    "lock_lease_s": 1,
}


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
                params = {"user_id": record.user_id, "wait": "5"}
                async with http.get(target, params=params) as resp:
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
