"""Private Redis, Sentinel and PostgreSQL servers on free ports, breakable on purpose.

Every server is a child process of the test run, in its own temporary
directory, on a port nobody else uses; the shared servers on 6379 and 5432 are
never touched. Lifecycle operations (start, stop, kill, restart) are
coroutines that wait, with a deadline, until the server answers or is gone;
``pause``/``resume`` only send a signal. Nothing here stores an asyncio object,
so a server started under one event loop can be driven from another.

Leaks would break other people's work on this machine, so a process is killed
three ways: by its owner (``close()``, ``async with``), by an ``atexit`` hook,
and by the kernel when the test run dies without running either (children are
spawned from the main thread with ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

import asyncpg
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

HOST = "127.0.0.1"
Address = tuple[str, int]
T = TypeVar("T")

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
# Set CHAOS_KEEP_TMP=1 to keep server directories (configs, logs) after a run.
KEEP_TMP = os.environ.get("CHAOS_KEEP_TMP") == "1"
# Ports handed out are drawn below Linux's ephemeral range (32768-60999), so
# an outgoing connection cannot take a server's port while it is restarting.
PORT_RANGE = (20000, 32000)
POLL_S = 0.05


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    """A loopback TCP port that is free now and was not handed out before in this run."""
    for _ in range(200):
        port = random.randrange(*PORT_RANGE)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port found")


_HANDED_OUT: set[int] = set()


class GaveUp(Exception):
    """Raised by a :func:`wait_for` check when waiting longer cannot help (process died)."""


async def wait_for(
    check: Callable[[], Awaitable[T | None]],
    *,
    within: float,
    what: str,
    interval: float = POLL_S,
) -> T:
    """Poll ``check`` until it returns a truthy value, which is returned.

    An exception from ``check`` counts as "not yet", except :class:`GaveUp`,
    which propagates at once. Raises :class:`TimeoutError` naming ``what`` and
    the last error once ``within`` seconds have passed.
    """
    deadline = time.monotonic() + within
    last: object = None
    while True:
        remaining = deadline - time.monotonic()
        try:
            async with asyncio.timeout(max(remaining, interval)):
                value = await check()
            if value:
                return value
            last = value
        except GaveUp:
            raise
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not within {within:.1f}s (last: {last!r})")
        await asyncio.sleep(interval)


# Looked up once here, not in the forked child.
_PRCTL = ctypes.CDLL(None).prctl if sys.platform == "linux" else None
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the test run dies."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' if there is none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class Child:
    """One child process we own: spawned, signalled, reaped and never leaked."""

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.user = user
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The pid of the current process, if one was spawned."""
        return None if self.proc is None else self.proc.pid

    @property
    def running(self) -> bool:
        """Whether the process was spawned and has not exited."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status of the last process (negative: killed by that signal)."""
        return None if self.proc is None else self.proc.poll()

    def spawn(self, banner: str | None = None) -> None:
        """Start the process, its output appended to the log file after ``banner``."""
        if self.running:
            raise RuntimeError(f"{self.argv[0]} is already running")
        ids: dict[str, Any] = {}
        if self.user is not None:
            ids = {"user": self.user, "group": self.user, "extra_groups": []}
        with open(self.log_path, "ab") as log:
            if banner is not None:
                log.write(f"{banner}\n".encode())
                log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env=self.env,
                preexec_fn=_die_with_parent,
                **ids,
            )
        _LIVE.add(self)

    def send(self, sig: int) -> None:
        """Send a signal if the process runs (no-op otherwise)."""
        if self.proc is not None and self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    async def wait_exit(self, within: float) -> int:
        """Wait (polling, non-blocking) until the process has exited; its status."""
        proc = self.proc
        if proc is None:
            return 0
        await wait_for(
            lambda: _done(proc.poll() is not None), within=within, what=f"{self.argv[0]} exit"
        )
        _LIVE.discard(self)
        return proc.returncode

    async def stop(self, sig: int = signal.SIGTERM, within: float = 10.0) -> None:
        """Ask the process to exit with ``sig``; SIGKILL it after ``within``."""
        if not self.running:
            await self.wait_exit(1)
            return
        # A stopped process only handles SIGTERM once it runs again.
        self.send(signal.SIGCONT)
        self.send(sig)
        try:
            await self.wait_exit(within)
        except TimeoutError:
            self.send(signal.SIGKILL)
            await self.wait_exit(10)

    async def kill(self) -> None:
        """SIGKILL the process and wait until it is reaped."""
        self.send(signal.SIGKILL)
        await self.wait_exit(10)

    def kill_now(self) -> None:
        """Synchronous SIGKILL and reap, for finalizers that have no event loop."""
        if self.proc is not None:
            self.send(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        _LIVE.discard(self)


async def _done(value: bool) -> bool:
    return value


_LIVE: set[Child] = set()


@atexit.register
def _kill_leftovers() -> None:
    """Last resort: whatever a test forgot to stop dies with the interpreter."""
    for child in list(_LIVE):
        child.kill_now()


def make_tmp(prefix: str, owner: str | None = None) -> Path:
    """A new directory under the system temp dir, owned by ``owner`` if given."""
    path = Path(tempfile.mkdtemp(prefix=f"chaos-{prefix}-"))
    if owner is not None:
        shutil.chown(path, owner, owner)
    return path


def remove_tmp(path: Path) -> None:
    """Remove a directory from :func:`make_tmp` (kept when CHAOS_KEEP_TMP=1)."""
    if not KEEP_TMP:
        shutil.rmtree(path, ignore_errors=True)


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


# --------------------------------------------------------------------------- Redis


class _RedisProcess:
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

    @property
    def running(self) -> bool:
        """Whether the process is alive (maybe paused)."""
        return self._child.running

    @property
    def pid(self) -> int | None:
        """The current process id."""
        return self._child.pid

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

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class RedisServer(_RedisProcess):
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

    async def wait_synced(self, within: float = 10.0) -> None:
        """Wait until this replica's link to its primary is up."""

        async def synced() -> bool:
            async with self.client() as r:
                info = await r.info("replication")
            return info.get("master_link_status") == "up"

        await wait_for(synced, within=within, what=f"replica {self.port} in sync")


class SentinelServer(_RedisProcess):
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


class RedisSentinelCluster:
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

    async def __aenter__(self) -> Self:
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# --------------------------------------------------------------------------- PostgreSQL


def _pg_bindir() -> Path:
    """The directory of initdb and postgres (CHAOS_PG_BIN, else the one of pg_ctl)."""
    explicit = os.environ.get("CHAOS_PG_BIN")
    if explicit:
        return Path(explicit)
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    if not candidates:
        raise RuntimeError("no PostgreSQL binaries found (set CHAOS_PG_BIN)")
    return candidates[-1]


def _children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command name is in parentheses and may hold spaces.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it holds no resources any more.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return False


async def _wait_gone(pids: Sequence[int], within: float) -> None:
    """Wait until none of ``pids`` runs: a new postmaster refuses to start while an
    old backend still holds the shared memory segment."""

    async def gone() -> bool:
        return not any(_alive(pid) for pid in pids)

    await wait_for(gone, within=within, what="old postgres backends exit")


_SHUTDOWN_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


class PostgresCluster:
    """A private PostgreSQL cluster: initdb'd in a temp dir, trust auth, fsync off.

    The postmaster runs as the ``postgres`` user (initdb and postgres refuse
    root) and as our direct child rather than daemonized by ``pg_ctl``, so it
    can never outlive the test run. Shutdown modes send the signals ``pg_ctl
    stop -m`` sends.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        user: str = "postgres",
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.user = user
        self.dir = make_tmp(f"pg-{self.port}", owner=user)
        self.data = self.dir / "data"
        self.log_path = self.dir / "postgres.log"
        # fsync and full_page_writes only protect against an OS crash, which no
        # test causes. synchronous_commit stays on: with it off, a SIGKILL'd
        # server loses commits it already acknowledged, and a chaos test would
        # blame the gateway for orders PostgreSQL forgot.
        self.settings = {
            "listen_addresses": HOST,
            "unix_socket_directories": str(self.dir),
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            **(settings or {}),
        }
        bindir = _pg_bindir()
        self._initdb = bindir / "initdb"
        argv = [str(bindir / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        self._child = Child(argv, self.log_path, cwd=self.dir, user=user)

    @property
    def running(self) -> bool:
        """Whether the postmaster is alive."""
        return self._child.running

    @property
    def pid(self) -> int | None:
        """The postmaster's pid."""
        return self._child.pid

    @property
    def address(self) -> Address:
        """(host, port) of the server."""
        return (HOST, self.port)

    def url(self, dbname: str = "postgres", address: Address | None = None) -> str:
        """postgresql:// URL of ``dbname``, at ``address`` (a proxy's) if given."""
        host, port = address or self.address
        return f"postgresql://{self.user}@{host}:{port}/{dbname}"

    async def start(self, within: float = 30.0) -> Self:
        """initdb on first start, then start the postmaster and wait for ``SELECT 1``."""
        if not (self.data / "PG_VERSION").exists():
            await self._run_initdb()
        self._child.spawn()
        await self.wait_ready(within)
        return self

    async def _run_initdb(self) -> None:
        argv = [
            str(self._initdb),
            "-D",
            str(self.data),
            "-U",
            self.user,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]
        result = await asyncio.to_thread(
            subprocess.run,
            argv,
            cwd=self.dir,
            user=self.user,
            group=self.user,
            extra_groups=[],
            capture_output=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed: {result.stderr.decode(errors='replace')}")

    async def ping(self, within: float = 2.0) -> bool:
        """Whether the server accepts a connection and answers ``SELECT 1``."""
        con = await asyncpg.connect(self.url(), timeout=within)
        try:
            return bool(await con.fetchval("SELECT 1", timeout=within))
        finally:
            await con.close(timeout=within)

    async def wait_ready(self, within: float = 30.0) -> None:
        """Wait until the server answers queries (crash recovery included)."""

        async def up() -> bool:
            if not self._child.running:
                raise GaveUp(f"postgres exited: {self.log_tail()}")
            return await self.ping(within=1.0)

        await wait_for(up, within=within, what=f"postgres on {self.port}", interval=0.1)

    async def stop(self, mode: str = "fast", within: float = 30.0) -> None:
        """Shut down like ``pg_ctl stop -m mode`` (smart, fast or immediate)."""
        backends = self._backends()
        await self._child.stop(_SHUTDOWN_SIGNALS[mode], within)
        await _wait_gone(backends, within=10)

    async def restart(self, mode: str = "fast", within: float = 30.0) -> None:
        """Stop with ``mode`` and start again on the same port."""
        await self.stop(mode)
        self._child.spawn()
        await self.wait_ready(within)

    async def kill(self) -> None:
        """SIGKILL the postmaster and every backend, as a machine crash would.

        The next :meth:`start` runs crash recovery.
        """
        backends = self._backends()
        self._child.send(signal.SIGKILL)
        for backend in backends:
            with contextlib.suppress(ProcessLookupError):
                os.kill(backend, signal.SIGKILL)
        await self._child.wait_exit(10)
        await _wait_gone(backends, within=10)

    def _backends(self) -> list[int]:
        pid = self._child.pid
        return _children_of(pid) if pid is not None and self.running else []

    async def create_database(self, name: str) -> str:
        """CREATE DATABASE ``name``; returns its URL."""
        con = await asyncpg.connect(self.url(), timeout=5)
        try:
            quoted = '"' + name.replace('"', '""') + '"'
            await con.execute(f"CREATE DATABASE {quoted}")
        finally:
            await con.close()
        return self.url(name)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server log."""
        return tail(self.log_path, lines)

    async def close(self) -> None:
        """Immediate shutdown (SIGKILL if that hangs) and removal of the directory."""
        if self.running:
            with contextlib.suppress(TimeoutError):
                await self.stop("immediate", within=10)
        self._child.kill_now()
        remove_tmp(self.dir)

    async def __aenter__(self) -> Self:
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
