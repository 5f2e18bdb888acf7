"""Private redis-servers on free ports, breakable on purpose, and short-lived clients.

Every server is a child process of the test run, in its own temporary
directory, on a port nobody else uses; the shared server on 6379 is never
touched. Lifecycle operations (start, stop, kill, restart) are coroutines that
wait, with a deadline, until the server answers or is gone; ``pause``/``resume``
only send a signal. Nothing here stores an asyncio object, so a server started
under one event loop can be driven from another.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
from collections.abc import AsyncIterator
from typing import Any, Self

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from testkit.polling import GaveUp, wait_for
from testkit.ports import HOST, Address, free_port
from testkit.processes import Child, OwnsChild, Started, make_tmp, remove_tmp, tail

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


@contextlib.asynccontextmanager
async def redis_client(address: Address, within: float = 1.0) -> AsyncIterator[Redis]:
    """A short-lived RESP2 client without retries (a failure must show, not be hidden)."""
    client = Redis(
        host=address[0],
        port=address[1],
        decode_responses=True,
        protocol=2,
        socket_timeout=within,
        socket_connect_timeout=within,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        yield client
    finally:
        await client.aclose()


async def command(client: Redis, *args: str | int) -> Any:
    """Send a raw command, each word separately, so redis-py applies no reply parser."""
    return await client.execute_command(*args)  # type: ignore[no-untyped-call]


async def raw_ping(address: Address, within: float = 1.0) -> bool:
    """Whether a Redis (or Sentinel) at ``address`` answers PING with PONG in time."""
    async with asyncio.timeout(within):
        reader, writer = await asyncio.open_connection(*address)
        try:
            writer.write(b"PING\r\n")
            await writer.drain()
            line = await reader.readline()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    return line.startswith(b"+PONG")


class RedisProcess(OwnsChild, Started):
    """A redis-server (or sentinel) with a config file of its own, in its own directory."""

    kind = "redis"

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.dir = make_tmp(f"{self.kind}-{self.port}")
        self.conf = self.dir / f"{self.kind}.conf"
        self.log_path = self.dir / f"{self.kind}.log"
        self._child = Child(self._argv(), self.dir / "stdout.log", cwd=self.dir)

    @property
    def address(self) -> Address:
        """(host, port) of the server."""
        return (HOST, self.port)

    def _argv(self) -> list[str]:
        return [REDIS_SERVER, str(self.conf)]

    def _config(self) -> list[str]:
        return [
            f"port {self.port}",
            f"bind {HOST}",
            "protected-mode no",
            "daemonize no",
            f"dir {self.dir}",
            f"logfile {self.log_path}",
        ]

    async def start(self, within: float = 10.0) -> Self:
        """Start the server (config written on first start) and wait for PING."""
        if not self.conf.exists():
            # Written once: Sentinel and CONFIG REWRITE edit it afterwards.
            self.conf.write_text("\n".join(self._config()) + "\n")
        self._child.spawn()
        await self.wait_ready(within)
        return self

    async def wait_ready(self, within: float = 10.0) -> None:
        """Wait until the server answers PING."""

        async def up() -> bool:
            if not self._child.running:
                raise GaveUp(f"{self.kind} exited: {self.log_tail()}")
            return await raw_ping(self.address, within=0.5)

        await wait_for(up, within=within, what=f"{self.kind} on {self.port}")

    async def stop(self, within: float = 10.0) -> None:
        """Clean shutdown (SIGTERM; SIGKILL after ``within``)."""
        await self._child.stop(signal.SIGTERM, within)

    async def kill(self) -> None:
        """SIGKILL: the process dies at once, without saving anything."""
        await self._child.kill()

    async def restart(self, within: float = 10.0) -> None:
        """Kill (if running) and start again on the same port with the same config file."""
        if self.running:
            await self.kill()
        self._child.spawn()
        await self.wait_ready(within)

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing is answered."""
        self._child.send(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self._child.send(signal.SIGCONT)

    def client(self, within: float = 1.0) -> contextlib.AbstractAsyncContextManager[Redis]:
        """A short-lived client on this server (``async with server.client() as r``)."""
        return redis_client(self.address, within)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's log (its own log file, else its stdout)."""
        return tail(self.log_path, lines) or tail(self.dir / "stdout.log", lines)

    async def close(self) -> None:
        """Kill the process and remove its directory."""
        await self._child.kill()
        remove_tmp(self.dir)


class RedisServer(RedisProcess):
    """A private redis-server without persistence: a restart comes back empty.

    ``replicaof`` starts it as a replica. Sentinel may rewrite the config file
    (``replicaof`` lines), which :meth:`restart` then honours, as a real
    deployment would.
    """

    def __init__(self, port: int | None = None, *, replicaof: Address | None = None) -> None:
        self._replicaof = replicaof
        super().__init__(port)

    def url(self, db: int = 0, address: Address | None = None) -> str:
        """redis:// URL of database ``db``, at ``address`` (a proxy's) if given."""
        host, port = address or self.address
        return f"redis://{host}:{port}/{db}"

    def _config(self) -> list[str]:
        lines = [
            *super()._config(),
            'save ""',
            "appendonly no",
            # Full syncs start at once instead of waiting 5 s for more replicas.
            "repl-diskless-sync yes",
            "repl-diskless-sync-delay 0",
        ]
        if self._replicaof is not None:
            lines.append(f"replicaof {self._replicaof[0]} {self._replicaof[1]}")
        return lines

    async def replicaof(self, other: RedisServer | Address | None) -> None:
        """REPLICAOF ``other`` (a server or an address), or NO ONE for None."""
        async with self.client() as r:
            if other is None:
                await command(r, "REPLICAOF", "NO", "ONE")
                return
            host, port = other.address if isinstance(other, RedisServer) else other
            await command(r, "REPLICAOF", host, str(port))

    async def role(self) -> str:
        """'master' or 'slave' (first element of ROLE)."""
        async with self.client() as r:
            reply = await command(r, "ROLE")
        return str(reply[0])

    async def synced(self) -> bool:
        """Whether this server is a replica whose link to its primary is up."""
        async with self.client() as r:
            info = await r.info("replication")
        return bool(info.get("role") == "slave" and info.get("master_link_status") == "up")

    async def wait_synced(self, within: float = 10.0) -> None:
        """Wait until this replica's link to its primary is up."""
        await wait_for(self.synced, within=within, what=f"replica {self.port} in sync")
