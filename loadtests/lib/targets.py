"""A server under load: a subprocess on a loopback port, its URL, sku set-up,
metrics, memory and log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loadtests.lib.memory import memory_kib
from testkit.http import http
from testkit.metrics import totals
from testkit.polling import GaveUp, wait_for
from testkit.ports import HOST
from testkit.processes import tail

START_TIMEOUT_S = 30.0


@dataclass
class Target:
    """One server under test, running as a subprocess on a loopback port."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    admin_token: str | None = None
    # How a sku is created or reset on this target: (sku, stock) -> None.
    setup: Callable[[Target, str, int], None] | None = None

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:40123``."""
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        """The server's process id (the Python process itself, not a wrapper)."""
        return self.process.pid

    def put_sku(self, sku: str, stock: int) -> None:
        """Create ``sku`` with ``stock`` units (per-user limit 1), or reset it."""
        if self.setup is not None:
            self.setup(self, sku, stock)

    def memory(self) -> dict[str, int]:
        """VmRSS and VmHWM of the server process, in KiB."""
        return memory_kib(self.pid)

    def scrape(self, prefix: str = "flashsale_") -> dict[str, float]:
        """``GET /metrics``: every sample named ``prefix*``, summed over its labels.

        Empty when the target has no metrics (the baselines, or metrics off).
        """
        try:
            status, body = http("GET", f"{self.url}/metrics", timeout=5.0)
        except OSError:
            return {}
        if status != 200 or not isinstance(body, str):
            return {}
        return totals(body, prefix)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's output, for error messages."""
        return tail(self.log_path, lines)

    def log_problems(self) -> dict[str, int]:
        """Warnings and errors the server logged, counted by event.

        The gateway logs JSON lines with ``level`` and ``event``; anything else
        (tracebacks, aiohttp's own stderr) counts under ``"<text>"``.
        """
        counts: Counter[str] = Counter()
        with contextlib.suppress(OSError):
            for line in self.log_path.read_text(errors="replace").splitlines():
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except ValueError:
                    counts["<text>"] += 1
                    continue
                if isinstance(entry, dict) and entry.get("level") in ("warning", "error"):
                    counts[f"{entry['level']}:{entry.get('event')}"] += 1
        return dict(counts)


def gateway_put_sku(target: Target, sku: str, stock: int) -> None:
    """A gateway's sku set-up: ``PUT /admin/skus/{sku}`` with its admin token."""
    _put_sku(target, sku, {"stock": stock, "per_user_limit": 1}, target.admin_token)


def naive_put_sku(target: Target, sku: str, stock: int) -> None:
    """The naive baseline's sku set-up: ``PUT /admin/skus/{sku}``, no token."""
    _put_sku(target, sku, {"stock": stock}, None)


def _put_sku(target: Target, sku: str, body: dict[str, int], token: str | None) -> None:
    status, answer = http("PUT", f"{target.url}/admin/skus/{sku}", body, token=token)
    if status != 200:
        raise RuntimeError(f"{target.name}: PUT /admin/skus/{sku} answered {status}: {answer}")


def wait_ready(target: Target, path: str = "/healthz", timeout: float = START_TIMEOUT_S) -> None:
    """Poll ``path`` until it answers 200 (blocking).

    Raises:
        RuntimeError: the process exited, or ``timeout`` passed; with its log.
    """

    async def ready() -> bool:
        code = target.process.poll()
        if code is not None:
            raise GaveUp(f"{target.name} exited with {code} while starting")
        status, body = http("GET", f"{target.url}{path}", timeout=1.0)
        if status != 200:
            raise RuntimeError(f"{status} {body}")
        return True

    try:
        asyncio.run(wait_for(ready, within=timeout, what=f"{target.name} ready on {path}"))
    except (GaveUp, TimeoutError) as exc:
        raise RuntimeError(f"{exc}:\n{target.log_tail()}") from None
