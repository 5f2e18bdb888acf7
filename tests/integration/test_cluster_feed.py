"""The sold-out change feed on a Redis Cluster, across shards.

Each gateway's feed is one classic SUBSCRIBE on one node of the session's cluster
(``redis_cluster``); the announcements are PUBLISHed by the scripts on whichever
primary holds the sku. These tests pick skus held by shards other than the one
the listening gateway subscribed on, so the message must cross the cluster bus.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway.redis.layout import SkuKeys, channel
from gateway.usecases.sold_out import MARK_TTL_S
from testkit.polling import wait_for
from testkit.purchases import buy, client_metric, put_sku
from testkit.redis_cluster import ClusterNodeServer, LocalRedisCluster
from testkit.redis_servers import command

pytestmark = pytest.mark.timeout(90)

Client = TestClient[web.Request, web.Application]
StartGateway = Callable[..., Awaitable[Client]]
Shard = tuple[str, int]  # the address of the primary serving a shard's slots


async def shard_of(cluster: LocalRedisCluster, node: ClusterNodeServer) -> Shard:
    """The primary ``node`` belongs to: itself, or the primary it replicates."""
    async with node.client() as r:
        role = await command(r, "ROLE")
    if role[0] == "master":
        return node.address
    return str(role[1]), int(role[2])


async def feed_shards(cluster: LocalRedisCluster, feed: str) -> list[Shard]:
    """The shard of every node with a subscriber on ``feed``, once per subscriber
    (classic PUBSUB NUMSUB counts only the node's own clients)."""
    found: list[Shard] = []
    for node in cluster.nodes:
        if not node.running:
            continue
        async with node.client() as r:
            _, count = await command(r, "PUBSUB", "NUMSUB", feed)
        found += [await shard_of(cluster, node)] * int(count)
    return found


async def skus_on_other_shards(
    cluster: LocalRedisCluster, prefix: str, avoid: Shard, count: int
) -> dict[str, Shard]:
    """``count`` skus, each on a different shard, none of them ``avoid``."""
    chosen: dict[str, Shard] = {}
    for n in range(200):
        sku = f"{prefix}-x{n}"
        primary = await cluster.primary_of(SkuKeys.of(prefix, sku).stock)
        if primary.address != avoid and primary.address not in chosen.values():
            chosen[sku] = primary.address
        if len(chosen) == count:
            return chosen
    raise LookupError(f"no {count} shards besides {avoid}: {chosen}")


async def mark_sold_out(client: Client, skus: list[str], builds: int) -> None:
    """Buy each sku through ``client`` (each answers 409) until the gateway has
    built its sold-out filters (``builds`` in all): the skus are marked in-process."""
    users = iter(range(1_000))

    async def marked() -> bool:
        for sku in skus:
            status, body = await buy(client, sku, f"late-{next(users)}")
            assert (status, body) == (409, {"status": "sold_out"}), (sku, status, body)
        return await client_metric(client, "flashsale_confirmed_id_builds_total") >= builds

    await wait_for(marked, within=3, what=f"{skus} marked sold out")


async def test_a_restock_through_one_gateway_clears_the_other_gateways_mark_across_shards(
    redis_cluster: LocalRedisCluster, start_gateway: StartGateway, key_prefix: str
) -> None:
    """Gateway B subscribes first, on some node; two skus live on the two other
    shards. Each sku sells its one unit through A, and both A and B mark it sold
    out. A restocks both (load_stock.lua PUBLISHes on each sku's own primary):
    B sells each new unit before its mark could have expired, so B's mark was
    cleared by the announcement that crossed shards, not by the mark's TTL."""
    nodes = redis_cluster.startup_nodes
    feed = channel(key_prefix)
    gateway_b = await start_gateway(redis_cluster_nodes=nodes)
    (b_shard,) = await wait_for(
        lambda: feed_shards(redis_cluster, feed), within=10, what="gateway B's feed subscribed"
    )
    gateway_a = await start_gateway(redis_cluster_nodes=nodes)

    async def both_subscribed() -> bool:
        return len(await feed_shards(redis_cluster, feed)) == 2

    await wait_for(both_subscribed, within=10, what="gateway A's feed subscribed too")
    placed = await skus_on_other_shards(redis_cluster, key_prefix, b_shard, count=2)
    skus = list(placed)
    for sku in skus:
        await put_sku(gateway_a, sku, 1)
        assert (await buy(gateway_a, sku, "first"))[0] == 201

    loop = asyncio.get_running_loop()
    # No mark of B's can expire before this: each was set after B's first 409.
    b_marks_expire = loop.time() + MARK_TTL_S
    await mark_sold_out(gateway_b, skus, builds=len(skus))
    await mark_sold_out(gateway_a, skus, builds=len(skus))
    for sku in skus:
        await put_sku(gateway_a, sku, 1)  # the unit sold stays sold: one more now

    users = iter(range(1_000))

    async def b_sells(sku: str) -> bool:
        status, body = await buy(gateway_b, sku, f"restocked-{next(users)}")
        assert status in (201, 409), (status, body)
        return status == 201

    for sku in skus:
        left = b_marks_expire - loop.time() - 0.2
        assert left > 0, "the set-up took longer than a mark lives: nothing is shown"
        await wait_for(
            partial(b_sells, sku), within=left, what=f"B sells {sku} (shard {placed[sku]})"
        )
