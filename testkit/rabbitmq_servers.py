"""A private RabbitMQ node on free ports, for the tests that stop and start a broker.

The shared broker on 127.0.0.1:5672 is never restarted (others publish to it).
This one runs from Debian's ``rabbitmq-server`` scripts with everything of its
own under a temporary directory: node name, AMQP and distribution ports, data
(``RABBITMQ_MNESIA_BASE``), logs, no plugins, and an Erlang cookie in its own
``HOME`` (mode 0400, or Erlang refuses it) that ``rabbitmqctl`` reads too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from pathlib import Path
from typing import Self

from testkit.polling import GaveUp, wait_for
from testkit.ports import HOST, free_port
from testkit.processes import Child, OwnsChild, Started, make_tmp, remove_tmp, tail

SBIN = Path("/usr/lib/rabbitmq/bin")
# A node boots in about 5 s here; far more means it will not.
BOOT_WITHIN_S = 60.0
CTL_WITHIN_S = 30.0


class RabbitServer(Started, OwnsChild):
    """One RabbitMQ node in a temporary directory; ``url`` is its AMQP URL (guest)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = make_tmp("rabbitmq")
        # Its own name: two test sessions on one machine must not meet in epmd.
        self.node = f"flashsale-test-{self.port}@localhost"
        cookie = self.dir / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)
        (self.dir / "enabled_plugins").write_text("[].\n")
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": str(self.dir),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "none"),
            "RABBITMQ_PID_FILE": str(self.dir / "pid"),
        }
        argv = [str(SBIN / "rabbitmq-server")]
        self._child = Child(argv, self.dir / "rabbitmq.log", env=self.env, cwd=self.dir)

    @property
    def url(self) -> str:
        """The AMQP URL of the node, as guest (allowed from loopback)."""
        return f"amqp://guest:guest@{HOST}:{self.port}/"

    async def start(self) -> Self:
        """Spawn the node and wait until it accepts AMQP connections."""
        self._child.spawn()
        await wait_for(self._listening, within=BOOT_WITHIN_S, what="rabbitmq listens")
        await self.ctl("await_startup")
        return self

    async def _listening(self) -> bool:
        if not self._child.running:
            raise GaveUp(f"rabbitmq exited ({self.returncode}):\n{self.log_tail()}")
        try:
            _, writer = await asyncio.open_connection(HOST, self.port)
        except OSError:
            return False
        writer.close()
        await writer.wait_closed()
        return True

    async def ctl(self, *args: str) -> None:
        """Run ``rabbitmqctl -n <node> <args>``; raises RuntimeError when it fails."""
        proc = await asyncio.create_subprocess_exec(
            str(SBIN / "rabbitmqctl"),
            "-n",
            self.node,
            "-q",
            *args,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(CTL_WITHIN_S):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {out.decode(errors='replace')}")

    async def stop_app(self) -> None:
        """Stop the broker (the node stays up): every connection is closed."""
        await self.ctl("stop_app")

    async def start_app(self) -> None:
        """Start the broker again, its durable queues and their messages back."""
        await self.ctl("start_app")
        await self.ctl("await_startup")

    def log_tail(self, lines: int = 40) -> str:
        """The end of the node's output."""
        return tail(self._child.log_path, lines)

    async def close(self) -> None:
        """Stop the node and remove its directory."""
        if self._child.running:
            # Failing that, the child's SIGTERM, then SIGKILL, below.
            with contextlib.suppress(RuntimeError, TimeoutError):
                await self.ctl("stop")
        await self._child.stop(within=15)
        remove_tmp(self.dir)
