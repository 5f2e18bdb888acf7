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

from tests.support.polling import GaveUp, wait_for
from tests.support.ports import HOST, free_port
from tests.support.processes import Child, OwnsChild, Started, make_tmp, remove_tmp, tail

JAR = Path("/usr/share/java/zookeeper.jar")  # its manifest's Class-Path names the rest
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
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
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "zookeeper"],
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

    def __init__(self) -> None:
        ensure_installed()
        self.port = free_port()
        self.dir = make_tmp("zookeeper")
        config = self.dir / "zoo.cfg"
        config.write_text(
            "\n".join(
                [
                    f"tickTime={TICK_MS}",
                    f"dataDir={self.dir / 'data'}",
                    f"clientPort={self.port}",
                    f"clientPortAddress={HOST}",
                    f"minSessionTimeout={2 * TICK_MS}",
                    "maxSessionTimeout=60000",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,srvr",
                    "",
                ]
            )
        )
        java = shutil.which("java") or "/usr/bin/java"
        argv = [java, "-Xmx256m", "-cp", str(JAR), MAIN, str(config)]
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

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's log."""
        return tail(self._child.log_path, lines)

    async def close(self) -> None:
        """Stop the server and remove its directory."""
        await self._child.stop(within=10)
        remove_tmp(self.dir)
