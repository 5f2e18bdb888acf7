"""Redis Sentinel: one Sentinel process, and a primary-replica pair watched by three.

Built on :mod:`testkit.redis_servers`; every process is private, on a
free port, and dies with the test run.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from typing import Self

from testkit.polling import wait_for
from testkit.ports import HOST, Address
from testkit.processes import Started
from testkit.redis_servers import (
    REDIS_SERVER,
    RedisProcess,
    RedisServer,
    command,
    redis_client,
)


class SentinelServer(RedisProcess):
    """One Redis Sentinel watching one primary under ``master_name``."""

    kind = "sentinel"

    def __init__(
        self,
        monitor: Address,
        *,
        master_name: str,
        quorum: int,
        down_after_ms: int,
        failover_timeout_ms: int,
        port: int | None = None,
    ) -> None:
        self.monitor = monitor
        self.master_name = master_name
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        super().__init__(port)

    def _argv(self) -> list[str]:
        return [REDIS_SERVER, str(self.conf), "--sentinel"]

    def _config(self) -> list[str]:
        name = self.master_name
        return [
            *super()._config(),
            "sentinel resolve-hostnames no",
            f"sentinel announce-ip {HOST}",
            f"sentinel monitor {name} {self.monitor[0]} {self.monitor[1]} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]

    async def master_state(self) -> dict[str, str]:
        """SENTINEL MASTER as a dict of strings (num-slaves, num-other-sentinels, ...)."""
        async with self.client() as r:
            # Sent as separate words so redis-py applies no parser of its own.
            reply = await command(r, "SENTINEL", "MASTER", self.master_name)
        if isinstance(reply, dict):
            return {str(k): str(v) for k, v in reply.items()}
        return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply), 2)}

    async def master_address(self) -> Address:
        """The primary's address as this sentinel sees it."""
        async with self.client() as r:
            host, port = await command(r, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
        return (str(host), int(port))


class RedisSentinelCluster(Started):
    """A primary, one replica and three Sentinels (quorum 2) for ``master_name``.

    Sentinels notice a dead primary after ``down_after_ms`` and promote the
    replica; :meth:`wait_for_failover` waits until a majority of them name a
    new primary that says it is one.
    """

    def __init__(
        self,
        master_name: str = "flashsale",
        *,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 500,
        failover_timeout_ms: int = 2000,
    ) -> None:
        self.master_name = master_name
        primary = RedisServer()
        replica = RedisServer(replicaof=primary.address)
        self.nodes: list[RedisServer] = [primary, replica]
        self.sentinels = [
            SentinelServer(
                primary.address,
                master_name=master_name,
                quorum=quorum,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
            )
            for _ in range(sentinels)
        ]
        self._last_primary: Address = primary.address

    def sentinel_addresses(self) -> list[Address]:
        """(host, port) of every Sentinel."""
        return [s.address for s in self.sentinels]

    def node_at(self, address: Address) -> RedisServer:
        """The data node listening on ``address``."""
        for node in self.nodes:
            if node.address == tuple(address):
                return node
        raise KeyError(f"no node at {address}")

    async def start(self, within: float = 30.0) -> Self:
        """Start both data nodes and the Sentinels; wait until all know each other.

        A Sentinel that has not yet discovered the replica or its peers cannot
        fail over, so a test that kills the primary too early would only test
        this fixture.
        """
        deadline = time.monotonic() + within
        for node in self.nodes:
            await node.start()
        await self.nodes[1].wait_synced(within=max(deadline - time.monotonic(), 1))
        for sentinel in self.sentinels:
            await sentinel.start()
        peers = str(len(self.sentinels) - 1)

        async def acquainted() -> bool:
            for sentinel in self.sentinels:
                state = await sentinel.master_state()
                if state.get("num-slaves") != "1" or state.get("num-other-sentinels") != peers:
                    return False
            return True

        await wait_for(
            acquainted,
            within=max(deadline - time.monotonic(), 1),
            what="sentinels discover the replica and each other",
            interval=0.1,
        )
        return self

    async def master_address(self) -> Address:
        """The primary's address, asked from the first Sentinel that answers."""
        errors: list[BaseException] = []
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            try:
                return await sentinel.master_address()
            except Exception as exc:
                errors.append(exc)
        raise ConnectionError(f"no sentinel answered: {errors!r}")

    async def primary(self) -> RedisServer:
        """The data node the Sentinels currently name primary."""
        return self.node_at(await self.master_address())

    async def kill_primary(self) -> Address:
        """SIGKILL the current primary; returns its address."""
        address = await self.master_address()
        self._last_primary = address
        await self.node_at(address).kill()
        return address

    async def wait_for_failover(self, within: float = 20.0, old: Address | None = None) -> Address:
        """Wait until a majority of Sentinels name a new primary that has the master role.

        ``old`` defaults to the address :meth:`kill_primary` returned last.
        Returns the new primary's address.
        """
        previous: Address = old if old is not None else self._last_primary
        majority = len(self.sentinels) // 2 + 1

        async def promoted() -> Address | None:
            votes: Counter[Address] = Counter()
            for sentinel in self.sentinels:
                with contextlib.suppress(Exception):
                    votes[await sentinel.master_address()] += 1
            if not votes:
                return None
            address, count = votes.most_common(1)[0]
            if address == previous or count < majority:
                return None
            async with redis_client(address) as r:
                role = await command(r, "ROLE")
            return address if role[0] == "master" else None

        return await wait_for(
            promoted, within=within, what=f"failover of {self.master_name}", interval=0.1
        )

    def log_tails(self, lines: int = 20) -> str:
        """The end of every node's and Sentinel's log, for failure messages."""
        parts = []
        for server in [*self.nodes, *self.sentinels]:
            parts.append(f"--- {server.kind} {server.port}\n{server.log_tail(lines)}")
        return "\n".join(parts)

    async def close(self) -> None:
        """Kill every process and remove every directory."""
        for server in [*self.sentinels, *self.nodes]:
            await server.close()
