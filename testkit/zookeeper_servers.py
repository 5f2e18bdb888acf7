"""A private standalone ZooKeeper on a free port, for the lock tests and load tests.

Debian's ``zookeeper`` package (installed with apt-get when missing, as root, the
way ``scripts/services.sh`` installs the other servers) brings the jar and its
dependencies; the server runs straight from it with a ``zoo.cfg`` and data
directory of its own in a temporary directory, so the system's configuration and
any system service are never touched. Ticks are short (100 ms) so sessions may
be as short as 0.2 s: a test can expire a stopped holder's session in a second.
Nothing here stores an asyncio object.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Self

from testkit.polling import GaveUp, wait_for
from testkit.ports import HOST, free_port
from testkit.processes import APT_WAIT, Child, OwnsChild, Started, make_tmp, remove_tmp, tail

JAR = Path("/usr/share/java/zookeeper.jar")  # its manifest's Class-Path names the rest
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
TICK_MS = 100


def ensure_installed() -> None:
    """Install Debian's ``zookeeper`` (and a JRE) when the jar is missing.

    Raises:
        RuntimeError: it is missing and cannot be installed (not root, no apt-get).
    """
    if JAR.exists():
        return
    if shutil.which("apt-get") is None:
        raise RuntimeError("ZooKeeper is missing: install Debian's 'zookeeper' package")
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    subprocess.run(["apt-get", *APT_WAIT, "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(
        ["apt-get", *APT_WAIT, "install", "-y", "-qq", "zookeeper"],
        check=True,
        env=env,
        timeout=900,
        stdout=subprocess.DEVNULL,
    )
    if not JAR.exists():
        raise RuntimeError(f"installed 'zookeeper' but {JAR} is still missing")


async def four_letter(port: int, word: str = "ruok", within: float = 1.0) -> str:
    """Send a four-letter command (``ruok``, ``srvr``) and return the answer."""
    async with asyncio.timeout(within):
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            writer.write(word.encode())
            await writer.drain()
            return (await reader.read()).decode()
        finally:
            writer.close()


class ZooKeeperServer(Started, OwnsChild):
    """One standalone ZooKeeper in a temporary directory, on a free loopback port."""

    def __init__(self, *, peers: list[str] | None = None, myid: int = 0, port: int = 0) -> None:
        """A standalone server; with ``peers`` (``server.N=host:p1:p2`` lines) and
        ``myid``, member ``myid`` of that ensemble, on client port ``port``."""
        ensure_installed()
        self.port = port or free_port()
        self.dir = make_tmp("zookeeper")
        data = self.dir / "data"
        lines = [
            f"tickTime={TICK_MS}",
            f"dataDir={data}",
            f"clientPort={self.port}",
            f"clientPortAddress={HOST}",
            f"minSessionTimeout={2 * TICK_MS}",
            "maxSessionTimeout=60000",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr",
        ]
        main = MAIN
        if peers:
            # A quorum member: the same peer list everywhere, its own id in dataDir.
            data.mkdir()
            (data / "myid").write_text(f"{myid}\n")
            lines += ["initLimit=50", "syncLimit=20", *peers]
            main = QUORUM_MAIN
        config = self.dir / "zoo.cfg"
        config.write_text("\n".join([*lines, ""]))
        java = shutil.which("java") or "/usr/bin/java"
        argv = [java, "-Xmx128m", "-cp", str(JAR), main, str(config)]
        self._child = Child(argv, self.dir / "zookeeper.log")

    @property
    def hosts(self) -> str:
        """The connection string of this server (``host:port``)."""
        return f"{HOST}:{self.port}"

    async def start(self) -> Self:
        """Spawn the server and wait until it answers ``imok``."""
        self._child.spawn()
        await wait_for(self._ok, within=60, what="zookeeper answers ruok")
        return self

    async def _ok(self) -> bool:
        if not self._child.running:
            raise GaveUp(f"zookeeper exited ({self.returncode}):\n{self.log_tail()}")
        return await four_letter(self.port) == "imok"

    def spawn(self) -> None:
        """Start the process without waiting (ensemble members wait for each other)."""
        self._child.spawn()

    async def serving(self) -> bool:
        """Whether the server serves clients (an ensemble member: it is in a quorum)."""
        return "Mode:" in await four_letter(self.port, "srvr")

    async def kill(self) -> None:
        """SIGKILL the server."""
        await self._child.kill()

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's log."""
        return tail(self._child.log_path, lines)

    async def close(self) -> None:
        """Stop the server and remove its directory."""
        await self._child.stop(within=10)
        remove_tmp(self.dir)


class ZooKeeperEnsemble(Started):
    """Three quorum members on loopback ports; a majority keeps it serving."""

    def __init__(self, size: int = 3) -> None:
        ids = range(1, size + 1)
        clients = {i: free_port() for i in ids}
        peers = [f"server.{i}={HOST}:{free_port()}:{free_port()}" for i in ids]
        self.members = [ZooKeeperServer(peers=peers, myid=i, port=clients[i]) for i in ids]

    async def leader(self) -> ZooKeeperServer:
        """The member that says it leads."""
        for member in self.members:
            if member.running and "Mode: leader" in await four_letter(member.port, "srvr"):
                return member
        raise RuntimeError("no zookeeper member leads")

    @property
    def hosts(self) -> str:
        """The connection string of every member."""
        return ",".join(member.hosts for member in self.members)

    async def start(self) -> Self:
        """Spawn every member; wait until each serves (a leader was elected)."""
        for member in self.members:
            member.spawn()
        for member in self.members:
            await wait_for(member.serving, within=90, what=f"zookeeper {member.port} in quorum")
        return self

    async def close(self) -> None:
        """Stop every member and remove their directories."""
        for member in self.members:
            await member.close()
