"""A private Redis Cluster: three primaries and three replicas on free ports.

Each node is a :class:`RedisServer` with ``cluster-enabled yes`` and its own
``nodes.conf`` in its own directory, so a node killed and started again comes
back as what the cluster made of it (a replica of its promoted replica).
``cluster-node-timeout`` is short, so a primary's death is a failover of about a
second. ``redis-cli --cluster create`` assigns the slots and pairs the replicas.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Self

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import ResponseError

from testkit.polling import wait_for
from testkit.ports import Address, free_port
from testkit.processes import Started
from testkit.redis_servers import RedisServer, command

REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


class ClusterNodeServer(RedisServer):
    """A redis-server that is one node of a cluster."""

    def __init__(self, node_timeout_ms: int) -> None:
        self._node_timeout_ms = node_timeout_ms
        # The bus would default to port + 10000, outside the range free_port checks.
        self.bus_port = free_port()
        super().__init__()

    def _config(self) -> list[str]:
        return [
            *super()._config(),
            "cluster-enabled yes",
            "cluster-config-file nodes.conf",
            f"cluster-port {self.bus_port}",
            f"cluster-node-timeout {self._node_timeout_ms}",
            # A replica takes over however stale: the gateway's books survive it.
            "cluster-replica-validity-factor 0",
        ]

    async def slot_owners(self) -> dict[tuple[int, int], Address]:
        """CLUSTER SLOTS as this node sees it: each slot range's primary."""
        async with self.client() as r:
            ranges = await command(r, "CLUSTER", "SLOTS")
        return {
            (int(first), int(last)): (str(primary[0]), int(primary[1]))
            for first, last, primary, *_ in ranges
        }

    async def cluster_info(self) -> dict[str, str]:
        """CLUSTER INFO as a dict (``cluster_state``, ``cluster_known_nodes``...)."""
        async with self.client() as r:
            text = str(await command(r, "CLUSTER", "INFO"))
        pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
        return {key: value.strip() for key, value in pairs}


class LocalRedisCluster(Started):
    """``primaries`` primaries with ``replicas`` replicas each, slots spread evenly."""

    def __init__(self, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> None:
        self._replicas = replicas
        count = primaries * (1 + replicas)
        self.nodes = [ClusterNodeServer(node_timeout_ms) for _ in range(count)]

    @property
    def startup_nodes(self) -> str:
        """``host:port,...`` of every node: the value of GATEWAY_REDIS_CLUSTER_NODES."""
        return ",".join(f"{host}:{port}" for host, port in (n.address for n in self.nodes))

    def client(self) -> RedisCluster:
        """A cluster client on these nodes (close it with ``aclose``)."""
        seeds = [ClusterNode(host, port) for host, port in (n.address for n in self.nodes)]
        return RedisCluster(startup_nodes=seeds, decode_responses=True)

    async def start(self, within: float = 60.0) -> Self:
        """Start every node, create the cluster, and wait until every node says ok."""
        await asyncio.gather(*(node.start() for node in self.nodes))
        addresses = [f"{host}:{port}" for host, port in (n.address for n in self.nodes)]
        create = await asyncio.create_subprocess_exec(
            REDIS_CLI,
            "--cluster",
            "create",
            *addresses,
            "--cluster-replicas",
            str(self._replicas),
            "--cluster-yes",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await create.communicate()
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {output.decode()[-2000:]}")
        await self.wait_healthy(within)
        return self

    async def wait_healthy(self, within: float = 30.0) -> None:
        """Wait until the cluster has :meth:`settled`."""
        await wait_for(self.settled, within=within, what="the cluster settled", interval=0.1)

    async def settled(self) -> bool:
        """Whether every running node reports ``cluster_state:ok`` and knows all
        nodes, names the same primary for each slot, and is what that map says:
        a master, or a replica whose link to its primary is up.

        ``cluster_state:ok`` alone is not enough after a restart: a killed primary
        comes back believing, from its ``nodes.conf``, that it still serves its
        slots until the cluster bus tells it otherwise. A client that read the slot
        map from it wrote there, and its resync as a replica dropped the write (a
        flush lock taken a moment before was lost that way)."""
        running = [node for node in self.nodes if node.running]
        count = str(len(self.nodes))
        maps = []
        for node in running:
            info = await node.cluster_info()
            if info.get("cluster_state") != "ok" or info.get("cluster_known_nodes") != count:
                return False
            maps.append(await node.slot_owners())
        if not maps or any(m != maps[0] for m in maps[1:]):
            return False
        owners = set(maps[0].values())
        for node in running:
            if node.address in owners:
                if await node.role() != "master":
                    return False
            elif not await node.synced():
                return False
        return True

    async def primaries(self) -> list[ClusterNodeServer]:
        """The running nodes whose role is master."""
        return [n for n in self.nodes if n.running and await n.role() == "master"]

    async def primary_of(self, key: str) -> ClusterNodeServer:
        """The primary serving ``key``'s slot (the others answer MOVED)."""
        for node in await self.primaries():
            async with node.client() as r:
                try:
                    await r.exists(key)
                except ResponseError:  # MOVED: another node's slot
                    continue
            return node
        raise LookupError(f"no primary serves {key!r}")

    def node_at(self, address: Address) -> ClusterNodeServer:
        """The node listening on ``address``."""
        for node in self.nodes:
            if node.address == tuple(address):
                return node
        raise KeyError(f"no node at {address}")

    async def replica_of(self, primary: ClusterNodeServer) -> ClusterNodeServer:
        """The replica that follows ``primary`` (the first one ROLE lists)."""
        async with primary.client() as r:
            role = await command(r, "ROLE")
        host, port = role[2][0][0], int(role[2][0][1])
        return self.node_at((str(host), port))

    async def fail_over(self, primary: ClusterNodeServer, within: float = 20.0) -> float:
        """SIGKILL ``primary`` and wait until its replica is master and the cluster ok.

        Returns the seconds the failover took (kill to every node's state ok).
        """
        replica = await self.replica_of(primary)
        started = asyncio.get_running_loop().time()
        await primary.kill()

        async def promoted() -> bool:
            if await replica.role() != "master":
                return False
            for node in self.nodes:
                if node.running and (await node.cluster_info()).get("cluster_state") != "ok":
                    return False
            return True

        await wait_for(promoted, within=within, what=f"replica {replica.port} promoted")
        return asyncio.get_running_loop().time() - started

    def log_tails(self, lines: int = 20) -> str:
        """The end of every node's log, for failure messages."""
        return "\n".join(f"--- node {n.port}\n{n.log_tail(lines)}" for n in self.nodes)

    async def close(self) -> None:
        """Kill every node and remove every directory."""
        for node in self.nodes:
            await node.close()
