"""A private PostgreSQL cluster on a free port, breakable on purpose.

initdb'd in a temporary directory, run as our direct child (never daemonized),
so it dies with the test run; restarts and crashes wait, with a deadline, until
the server answers again or every old backend is gone. A streaming standby of
one is copied with pg_basebackup, and promoted as a failover would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

import asyncpg

from testkit.polling import GaveUp, wait_for
from testkit.ports import HOST, Address, free_port
from testkit.processes import (
    Child,
    OwnsChild,
    Started,
    alive,
    children_of,
    make_tmp,
    remove_tmp,
    tail,
)


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


async def _wait_gone(pids: Sequence[int], within: float) -> None:
    """Wait until none of ``pids`` runs: a new postmaster refuses to start while an
    old backend still holds the shared memory segment."""

    async def gone() -> bool:
        return not any(alive(pid) for pid in pids)

    await wait_for(gone, within=within, what="old postgres backends exit")


_SHUTDOWN_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


class PostgresCluster(OwnsChild, Started):
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
        self._bindir = bindir = _pg_bindir()
        argv = [str(bindir / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        self._child = Child(argv, self.log_path, cwd=self.dir, user=user)

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
            await self._create_data()
        self._child.spawn()
        await self.wait_ready(within)
        return self

    async def _create_data(self) -> None:
        """Create the data directory: initdb (a standby copies its primary's instead)."""
        await self._run_as_owner(
            [
                str(self._bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                self.user,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )

    async def _run_as_owner(self, argv: Sequence[str]) -> None:
        """Run a PostgreSQL tool as the cluster's user in its directory; raises
        RuntimeError with the tool's output when it fails."""
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
            name = Path(argv[0]).name
            raise RuntimeError(f"{name} failed: {result.stderr.decode(errors='replace')}")

    async def ping(self, within: float = 2.0) -> bool:
        """Whether the server accepts a connection and answers ``SELECT 1``."""
        con = await asyncpg.connect(self.url(), timeout=within)
        try:
            return bool(await con.fetchval("SELECT 1", timeout=within))
        finally:
            await con.close(timeout=within)

    async def fetchval(self, query: str, *args: object, within: float = 5.0) -> object:
        """The first value of ``query`` on a connection of its own to ``postgres``."""
        con = await asyncpg.connect(self.url(), timeout=within)
        try:
            return await con.fetchval(query, *args, timeout=within)
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
        return children_of(pid) if pid is not None and self.running else []

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


class PostgresStandby(PostgresCluster):
    """A streaming standby of ``primary``: copied by ``pg_basebackup -R`` on its first
    start, on its own free port and temp dir, with the primary's settings.

    It follows the primary until it is stopped (or the primary is) and replays
    nothing after that; :meth:`promote` makes it a primary on a new timeline, as
    a failover does.
    """

    def __init__(self, primary: PostgresCluster, port: int | None = None) -> None:
        own = {"listen_addresses", "unix_socket_directories"}
        settings = {k: v for k, v in primary.settings.items() if k not in own}
        super().__init__(port, user=primary.user, settings=settings)
        self.primary = primary

    async def _create_data(self) -> None:
        """Copy the primary with pg_basebackup; ``-R`` writes ``standby.signal`` and
        the ``primary_conninfo`` it streams from."""
        host, port = self.primary.address
        await self._run_as_owner(
            [
                str(self._bindir / "pg_basebackup"),
                f"--host={host}",
                f"--port={port}",
                f"--username={self.primary.user}",
                f"--pgdata={self.data}",
                "--write-recovery-conf",
                "--wal-method=stream",
                "--checkpoint=fast",
                "--no-sync",
            ]
        )

    async def wait_replayed(self, within: float = 30.0) -> str:
        """Wait until this standby has replayed everything the primary has written
        so far; returns that position (an LSN)."""
        target = await self.primary.fetchval("SELECT pg_current_wal_lsn()::text")

        async def replayed() -> bool:
            return bool(
                await self.fetchval("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", target)
            )

        await wait_for(replayed, within=within, what=f"standby replays up to {target}")
        return str(target)

    async def promote(self, within: float = 30.0) -> None:
        """``SELECT pg_promote()``, waiting up to ``within`` until it accepts writes."""
        promoted = await self.fetchval(
            "SELECT pg_promote(true, $1)", int(within), within=within + 5
        )
        if not promoted:
            raise RuntimeError(f"promotion did not finish: {self.log_tail()}")
