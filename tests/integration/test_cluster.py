"""The gateway on a Redis Cluster of three primaries and three replicas.

Two in-process gateways share the session's cluster (``redis_cluster``) under this
test's key prefix. Sales spread over the shards by the skus' hash tags; the
checks are PostgreSQL's books against what every client saw
(``testkit.invariants``) and the audit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway.ops.audit import audit
from gateway.redis.layout import SkuKeys
from gateway.settings import Settings
from testkit.driver import DriverSummary, run_sale
from testkit.invariants import InvariantReport, check_invariants
from testkit.polling import wait_for
from testkit.purchases import ADMIN_HEADERS, put_sku
from testkit.redis_cluster import ClusterNodeServer, LocalRedisCluster

pytestmark = pytest.mark.timeout(120)

Client = TestClient[web.Request, web.Application]
StartGateway = Callable[..., Awaitable[Client]]

ORDERS_OF = "SELECT count(*) FROM orders WHERE sku = ANY($1::text[])"
ORDER_IDS_OF = "SELECT order_id::text FROM orders WHERE sku = ANY($1::text[])"


async def gateways(
    start_gateway: StartGateway, cluster: LocalRedisCluster, count: int = 2, **overrides: Any
) -> list[Client]:
    """``count`` in-process gateways on the cluster."""
    return [
        await start_gateway(redis_cluster_nodes=cluster.startup_nodes, **overrides)
        for _ in range(count)
    ]


async def sell(
    clients: Sequence[Client], skus: Sequence[str], users: int, **options: Any
) -> list[DriverSummary]:
    """One driver per sku, all at once, each buyer sticking to one gateway."""
    urls = [str(c.make_url("")).rstrip("/") for c in clients]
    return list(await asyncio.gather(*(run_sale(urls, s, users, **options) for s in skus)))


async def reports(
    database_url: str, skus: Sequence[str], stock: int, summaries: Sequence[DriverSummary]
) -> list[InvariantReport]:
    """The invariant report of every sku."""
    return [
        await check_invariants(database_url, sku, stock, summary, scenario="cluster")
        for sku, summary in zip(skus, summaries, strict=True)
    ]


async def keys_on(node: ClusterNodeServer, prefix: str) -> int:
    """How many keys under ``prefix`` the node holds."""
    async with node.client() as r:
        return len([k async for k in r.scan_iter(match=f"{prefix}:*", count=1000)])


async def test_fifty_skus_sell_exactly_across_every_shard(
    redis_cluster: LocalRedisCluster,
    start_gateway: StartGateway,
    database_url: str,
    key_prefix: str,
) -> None:
    """50 skus, 10 units and 15 buyers each, sold at once through two gateways: every
    sku sells exactly its stock, no buyer twice, every 201 is a row, each primary
    holds some of the skus' keys (the hash tags spread them over the slots), and
    every order's event reaches the event stream.

    The 750 buyers arrive over 2 s: they and both gateways share this one
    process's loop, and all at the same instant on a loaded machine (both cores
    busy) it could not answer within a buyer's 3 s attempts, so buyers ran out of
    retries, which reads as stock lost."""
    clients = await gateways(start_gateway, redis_cluster)
    skus = [f"{key_prefix}-c{i}" for i in range(50)]
    for sku in skus:
        await put_sku(clients[0], sku, 10)

    summaries = await sell(clients, skus, 15, start_spread_s=2.0, seed=5)

    for report in await reports(database_url, skus, 10, summaries):
        assert report.ok, str(report)
        assert report.sold == 10, str(report)
    for primary in await redis_cluster.primaries():
        assert await keys_on(primary, key_prefix) > 0, f"no keys on primary {primary.port}"
    await every_order_on_the_event_stream(redis_cluster, database_url, f"{key_prefix}:events", skus)


async def every_order_on_the_event_stream(
    cluster: LocalRedisCluster, database_url: str, stream: str, skus: Sequence[str]
) -> None:
    """Each order of ``skus`` reaches the event stream, one key in one slot of
    the cluster, appended by the gateways' relays."""
    con = await asyncpg.connect(database_url)
    try:
        orders = {r[0] for r in await con.fetch(ORDER_IDS_OF, skus)}
    finally:
        await con.close()
    client = cluster.client()
    try:

        async def relayed() -> bool:
            entries: list[tuple[str, dict[str, str]]] = await client.xrange(stream)  # type: ignore[assignment]
            return orders <= {fields["order_id"] for _, fields in entries}

        await wait_for(relayed, within=30, what="every order's event on the stream")
    finally:
        await client.aclose()


async def test_a_primary_killed_mid_sale_oversells_nothing_and_audits_clean(
    redis_cluster: LocalRedisCluster,
    start_gateway: StartGateway,
    make_settings: Callable[..., Settings],
    database_url: str,
    key_prefix: str,
) -> None:
    """SIGKILL of a primary while 12 skus sell; its replica takes over (maybe without
    the newest writes, and without the scripts). The gateways follow the new slot map;
    the database guard rejects what the stale copy over-admits: no oversell, no
    double buyer, no false 201, and after reconciliation the audit finds nothing."""
    # A lock whose release the failover lost blocks its sku for one lease: keep it short.
    overrides: dict[str, Any] = {
        "reservation_timeout_s": 1.0,
        "reconcile_interval_s": 0.5,
        "lock_lease_s": 2.0,
    }
    clients = await gateways(start_gateway, redis_cluster, **overrides)
    skus = [f"{key_prefix}-f{i}" for i in range(12)]
    for sku in skus:
        await put_sku(clients[0], sku, 30)
    victim = await redis_cluster.primary_of(SkuKeys.of(key_prefix, skus[0]).stock)

    sale = asyncio.create_task(sell(clients, skus, 45, start_spread_s=2.0, seed=11))
    try:
        await wait_for(
            lambda: _orders(database_url, skus, at_least=60), within=20, what="sale under way"
        )
        took = await redis_cluster.fail_over(victim)
        assert not sale.done(), "the sale ended before the failover"
        summaries = await sale
    finally:
        sale.cancel()
        await redis_cluster_restarted(redis_cluster, victim)

    async def reconciled() -> bool:
        resp = await clients[0].post("/admin/reconcile", headers=ADMIN_HEADERS)
        assert resp.status == 200, await resp.text()
        found = [row for sku in skus for row in await audit(settings, sku)]
        return not any(row.failed or row.drift for row in found)

    settings = make_settings(redis_cluster_nodes=redis_cluster.startup_nodes)
    await wait_for(reconciled, within=30, what="books balance after reconciliation")
    for report in await reports(database_url, skus, 30, summaries):
        assert not report.problems(allow_lost=True), f"{report} (failover {took:.1f}s)"


async def _orders(database_url: str, skus: Sequence[str], *, at_least: int) -> bool:
    con = await asyncpg.connect(database_url)
    try:
        return int(await con.fetchval(ORDERS_OF, list(skus))) >= at_least
    finally:
        await con.close()


async def redis_cluster_restarted(cluster: LocalRedisCluster, node: ClusterNodeServer) -> None:
    """Start a killed node again (it rejoins as a replica) and wait for the cluster."""
    if not node.running:
        await node.restart()
    await cluster.wait_healthy()
