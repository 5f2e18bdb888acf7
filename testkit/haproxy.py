"""HAProxy in front of test gateways, run from the shipped ``deploy/haproxy.cfg``.

The same file compose mounts; only its environment differs: the public and
internal frontends, the stats and the gateway addresses are loopback ports here.
``haproxy`` is installed by ``scripts/services.sh haproxy`` when missing
(apt-get, as root on Debian).

Also here: :func:`exchange`, one raw HTTP/1.1 exchange (for requests an HTTP
client would not send: dot segments, malformed heads, a head never finished),
and :class:`MisbehavingGateway`, an upstream that gives HAProxy what no real
gateway does (an answer that is not HTTP, no answer at all), so that HAProxy's
own 502 and 504 can be seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Self

import aiohttp
from redis.asyncio import Redis

from testkit.gateways import REPO, GatewayCluster
from testkit.polling import GaveUp, wait_for
from testkit.ports import HOST, free_port
from testkit.processes import Child, OwnsChild, Started, make_tmp, remove_tmp, tail
from testkit.services import REDIS_URL

CONFIG = REPO / "deploy" / "haproxy.cfg"
SBIN = "/usr/local/sbin:/usr/sbin:/sbin"


def _which() -> str | None:
    """haproxy on PATH, or in the sbin directories a user's PATH may leave out."""
    return shutil.which("haproxy") or shutil.which("haproxy", path=SBIN)


def haproxy_binary() -> str:
    """The haproxy executable, installed first when missing; raises if it cannot be."""
    found = _which()
    if found is None:
        subprocess.run(
            ["bash", str(REPO / "scripts" / "services.sh"), "haproxy"], check=True, timeout=600
        )
        found = _which()
    if found is None:
        raise RuntimeError("haproxy is not installed and could not be installed")
    return found


def check_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``haproxy -c -f deploy/haproxy.cfg`` with ``env``: the config's own verdict."""
    return subprocess.run(
        [haproxy_binary(), "-c", "-f", str(CONFIG)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class HAProxy(Started, OwnsChild):
    """One HAProxy process balancing over ``gateways`` (``host:port`` each, gw1, gw2)."""

    def __init__(self, gateways: Sequence[str]) -> None:
        self.port = free_port()
        self.internal_port = free_port()
        self.stats_port = free_port()
        self.dir = make_tmp("haproxy")
        self.env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "FRONTEND_ADDR": f"{HOST}:{self.port}",
            "INTERNAL_ADDR": f"{HOST}:{self.internal_port}",
            "STATS_ADDR": f"{HOST}:{self.stats_port}",
            **{f"GW{i}_ADDR": address for i, address in enumerate(gateways, start=1)},
        }
        argv = [haproxy_binary(), "-db", "-f", str(CONFIG)]
        self._child = Child(argv, self.dir / "haproxy.log", env=self.env)

    @property
    def url(self) -> str:
        """Where buyers connect: the public frontend."""
        return f"http://{HOST}:{self.port}"

    @property
    def internal_url(self) -> str:
        """Where operators connect: the internal frontend (admin API, /metrics)."""
        return f"http://{HOST}:{self.internal_port}"

    @property
    def stats_url(self) -> str:
        """HAProxy's stats page and its own Prometheus exporter."""
        return f"http://{HOST}:{self.stats_port}"

    async def start(self) -> Self:
        """Spawn HAProxy and wait until its stats page answers."""
        self._child.spawn()
        await wait_for(self.states, within=15, what="haproxy stats")
        return self

    async def stats(self) -> dict[str, dict[str, str]]:
        """The backend's rows of the stats CSV by ``svname`` (``gw1``, ``gw2``,
        ``BACKEND``): ``status``, ``wretr`` (retries), ``wredis`` (redispatches)..."""
        if not self._child.running:
            raise GaveUp(f"haproxy exited ({self.returncode}):\n{self.log_tail()}")
        url = f"{self.stats_url}/stats;csv"
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http,
            http.get(url) as response,
        ):
            text = (await response.text()).removeprefix("# ")
        return {
            row["svname"]: row
            for row in csv.DictReader(io.StringIO(text))
            if row["pxname"] == "gateways"
        }

    async def states(self) -> dict[str, str]:
        """Each gateway's status as HAProxy sees it (``gw1``: ``UP``, ``DOWN``, ...)."""
        return {
            name: row["status"].split()[0]
            for name, row in (await self.stats()).items()
            if name != "BACKEND"
        }

    async def wait_state(self, server: str, status: str, within: float = 15.0) -> None:
        """Wait until HAProxy reports ``server`` (``gw1``) with ``status`` (``UP``/``DOWN``)."""

        async def reached() -> bool:
            return (await self.states()).get(server) == status

        await wait_for(reached, within=within, what=f"haproxy: {server} {status}")

    def log_tail(self, lines: int = 40) -> str:
        """The end of HAProxy's log (errors, retries and redispatches only)."""
        return tail(self._child.log_path, lines)

    async def close(self) -> None:
        """Stop HAProxy and remove its directory."""
        await self._child.stop(within=5)
        remove_tmp(self.dir)


@contextlib.contextmanager
def behind_haproxy(cluster: GatewayCluster) -> Iterator[HAProxy]:
    """Start ``cluster`` and HAProxy over it (one gateway serves as both gw1 and
    gw2) for a module's tests, run outside any event loop; stop both and delete
    the cluster's Redis keys afterwards."""
    addresses = [f"{HOST}:{g.port}" for g in cluster]
    proxy = HAProxy(addresses * 2 if len(addresses) == 1 else addresses)
    try:
        asyncio.run(cluster.start())
        asyncio.run(proxy.start())
        yield proxy
    finally:
        asyncio.run(proxy.close())
        asyncio.run(cluster.close())
        asyncio.run(_delete_keys(cluster.key_prefix))


async def _delete_keys(prefix: str) -> None:
    client = Redis.from_url(REDIS_URL)
    async for key in client.scan_iter(match=f"{prefix}*", count=1000):
        await client.delete(key)
    await client.aclose()


@dataclass(frozen=True)
class Answer:
    """One HTTP answer as read off the wire."""

    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON (raises ValueError when it is not)."""
        return json.loads(self.body)


async def received(port: int, request: bytes, within: float = 10.0) -> bytes:
    """Send ``request`` as is to ``HOST:port``; every byte the server sends
    until it closes (send ``Connection: close``, or a request it refuses)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), within)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def exchange(port: int, request: bytes, within: float = 10.0) -> Answer:
    """:func:`received`, parsed as one HTTP answer."""
    raw = await received(port, request, within)
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split()[1]), headers, body)


def get(target: str, headers: str = "") -> bytes:
    """A GET of ``target`` (sent as written: no normalisation) that closes after."""
    return f"GET {target} HTTP/1.1\r\nHost: test\r\n{headers}Connection: close\r\n\r\n".encode()


class MisbehavingGateway(Started):
    """An upstream that passes HAProxy's health check (``/readyz`` 200) and then
    misbehaves: a path under ``/v1/stall`` is never answered, any other path is
    answered with bytes that are not HTTP."""

    def __init__(self) -> None:
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._closed = asyncio.Event()

    @property
    def address(self) -> str:
        """``host:port``, as HAProxy's GW*_ADDR takes it."""
        return f"{HOST}:{self.port}"

    async def start(self) -> Self:
        """Listen on the port."""
        self._server = await asyncio.start_server(self._serve, HOST, self.port)
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            if path == b"/readyz":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            elif path.startswith(b"/v1/stall"):
                await self._closed.wait()
            else:
                writer.write(b"this is not HTTP\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        """Release the stalled requests and stop listening."""
        self._closed.set()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
