"""HAProxy in front of test gateways, run from the shipped ``deploy/haproxy.cfg``.

The same file compose mounts; only its environment differs: the frontend,
stats and gateway addresses are loopback ports here. ``haproxy`` is installed
by ``scripts/services.sh haproxy`` when missing (apt-get, as root on Debian).
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from collections.abc import Sequence
from typing import Self

import aiohttp

from tests.support.gateways import REPO
from tests.support.polling import GaveUp, wait_for
from tests.support.ports import HOST, free_port
from tests.support.processes import Child, OwnsChild, Started, make_tmp, remove_tmp, tail

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
        self.stats_port = free_port()
        self.dir = make_tmp("haproxy")
        self.env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "FRONTEND_ADDR": f"{HOST}:{self.port}",
            "STATS_ADDR": f"{HOST}:{self.stats_port}",
            **{f"GW{i}_ADDR": address for i, address in enumerate(gateways, start=1)},
        }
        argv = [haproxy_binary(), "-db", "-f", str(CONFIG)]
        self._child = Child(argv, self.dir / "haproxy.log", env=self.env)

    @property
    def url(self) -> str:
        """Where buyers connect."""
        return f"http://{HOST}:{self.port}"

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
        url = f"http://{HOST}:{self.stats_port}/stats;csv"
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
