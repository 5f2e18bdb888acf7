"""Where the lock subscriber's connection comes from (``gateway.lock.subscriber``):
a client's connection pool, or, on a Redis Cluster, each node in turn.
"""

from __future__ import annotations

from typing import Protocol

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection


class Connections(Protocol):
    """Where the subscriber's connection comes from: a client's pool, or cluster nodes."""

    async def get_connection(self) -> AbstractConnection: ...

    async def release(self, connection: AbstractConnection) -> None: ...


class NodeInTurn:
    """Connections to the nodes of a cluster, each one to the next node in turn, so a
    reconnect leaves a dead node behind without waiting for the slot map to change."""

    def __init__(self, cluster: RedisCluster) -> None:
        self._cluster = cluster
        self._turn = 0
        self._owners: dict[AbstractConnection, ClusterNode] = {}

    async def get_connection(self) -> AbstractConnection:
        nodes = self._cluster.get_nodes()
        if not nodes:  # the client has sent nothing yet: learn the topology first
            await self._cluster.initialize()
            nodes = self._cluster.get_nodes()
        self._turn += 1
        node = nodes[self._turn % len(nodes)]
        conn = node.acquire_connection()
        self._owners[conn] = node
        return conn

    async def release(self, connection: AbstractConnection) -> None:
        node = self._owners.pop(connection, None)
        if node is not None:
            node.release(connection)  # type: ignore[arg-type]
