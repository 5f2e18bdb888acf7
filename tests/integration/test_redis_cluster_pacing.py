"""The gateway's cluster client learns the topology again at most every RELEARN_S
(gateway.redis.connections.PacedCluster), however many commands find its slot
map stale at once, on the session's real cluster.

redis-py marks the map stale with ``_initialize`` after a connection error (and
before the first command); these tests set that flag as a failover would, and
fail when the flag is gone or means something else in a new release.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode

from gateway.redis.connections import RELEARN_S, PacedCluster
from testkit.redis_cluster import LocalRedisCluster


@pytest.fixture
async def paced(redis_cluster: LocalRedisCluster) -> AsyncIterator[PacedCluster]:
    """A paced client on the session's cluster."""
    seeds = [ClusterNode(host, port) for host, port in (n.address for n in redis_cluster.nodes)]
    client = PacedCluster(startup_nodes=seeds, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


async def learnings(cluster: LocalRedisCluster) -> int:
    """How often the cluster's nodes have been asked its topology (CLUSTER SLOTS)."""
    total = 0
    for host, port in (n.address for n in cluster.nodes):
        async with Redis(host=host, port=port) as node:
            stats = await node.info("commandstats")
        total += int(stats.get("cmdstat_cluster|slots", {}).get("calls", 0))
    return total


async def test_a_new_client_learns_once_then_not_again(
    paced: PacedCluster, redis_cluster: LocalRedisCluster, key_prefix: str
) -> None:
    """A client that has not learned the topology yet learns it with its first
    command (at once: no pace before the first), and not for the next ones."""
    assert paced._initialize, "redis-py no longer marks a new client's map stale"
    before = await learnings(redis_cluster)
    keys = [f"{key_prefix}:{i}" for i in range(20)]
    try:
        for key in keys:
            await paced.set(key, "1")
        assert [await paced.get(k) for k in keys] == ["1"] * 20
        assert await learnings(redis_cluster) - before == 1
        assert not paced._initialize, "redis-py no longer clears the flag once learned"
    finally:
        for key in keys:
            await paced.delete(key)


async def test_a_map_found_stale_again_at_once_waits_out_the_pace(
    paced: PacedCluster, redis_cluster: LocalRedisCluster, key_prefix: str
) -> None:
    """A map marked stale five times in a row, as commands meeting a dead primary
    mark it: five learnings, spaced RELEARN_S apart (without the pace they
    take milliseconds), and every command answered. (Commands one at a time:
    redis-py 8.1.0's new connections race each other when many open at once,
    with or without the pace.)"""
    key = f"{key_prefix}:k"
    await paced.ping()
    before = await learnings(redis_cluster)
    started = time.monotonic()
    try:
        for _ in range(5):
            paced._initialize = True
            await paced.incr(key)
            await paced.incr(key)
        took = time.monotonic() - started
        assert await learnings(redis_cluster) - before == 5
        assert took >= 4 * RELEARN_S, f"five learnings in {took:.3f}s"
        assert await paced.get(key) == "10"
    finally:
        await paced.delete(key)
