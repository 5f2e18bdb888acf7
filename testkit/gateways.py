"""Gateway instances as real subprocesses: migrated once, started, killed, restarted.

Each instance is ``python -m gateway serve`` configured only through
``GATEWAY_*`` environment variables, run from the repository root, with its
output (structlog JSON lines) in a log file of its own; a restart appends to
the same file after a marker line. Processes are :class:`testkit.processes.Child`
objects, so they die with the test run whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Self

import aiohttp

from gateway.postgres.database import connect, ensure_database
from gateway.postgres.database import migrate as apply_migrations
from gateway.server import CLOSE_S
from testkit.metrics import scrape
from testkit.polling import GaveUp, wait_for
from testkit.ports import HOST, free_port
from testkit.processes import (
    Child,
    OwnsChild,
    Started,
    children_of,
    make_tmp,
    remove_tmp,
    tail,
)

REPO = Path(__file__).resolve().parents[1]
ADMIN_TOKEN = "chaos-admin-token"
# The drain of the test instances, and the longest a SIGTERM'd one may take to
# exit: the drain, then the bounded close, plus slack for a loaded machine.
DRAIN_S = 3.0
SIGTERM_EXIT_S = DRAIN_S + CLOSE_S + 4.0
# The lag check: a gateway whose event loop ran a timer this much late after
# start-up fails the test that ran it (see Gateway.lag_report). The calls it is
# for block for seconds (a cluster MULTI run in threads wedged a gateway for
# good; a synchronous connect waits out its timeout). At 0.25 s, four runs of the
# whole suite (two of them CI's) each failed one test on a timer 0.25-0.3 s late
# in ordinary code; at 0.5 s, a run with a core burned failed one on 0.54 s of
# the relay's work with Redis down (its loop thread on a CPU 81 % of it).
LAG_LIMIT_S = 1.0
# The lag the process caused, less its waits for a CPU: a loaded test machine
# (CI runs with a core burned) delays a timer by half a second through no fault
# of the gateway's.
LAG_BUCKETS = "flashsale_event_loop_own_lag_seconds_bucket"


def gateway_env(settings: Mapping[str, str | int | float]) -> dict[str, str]:
    """The process environment: ours minus any GATEWAY_* inherited, plus ``settings``.

    ``settings`` keys are setting names (``redis_url``) or full variable names
    (``GATEWAY_REDIS_URL``). With a ``key_prefix`` the event stream is
    ``<key_prefix>:events`` unless ``settings`` names one.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["PYTHONUNBUFFERED"] = "1"
    if "key_prefix" in settings:
        # The order events go to a stream under the test's own prefix, deleted
        # with its keys, never to the shared Redis's flashsale:events.
        env["GATEWAY_EVENTS_STREAM"] = f"{settings['key_prefix']}:events"
    for key, value in settings.items():
        name = key if key.startswith("GATEWAY_") else f"GATEWAY_{key.upper()}"
        env[name] = str(value)
    return env


class Gateway(OwnsChild):
    """One gateway process on a fixed port (kept across restarts)."""

    def __init__(self, index: int, env: Mapping[str, str], log_dir: Path) -> None:
        self.index = index
        self.port = free_port()
        self.log_path = log_dir / f"gateway-{index}.log"
        env = {**env, "GATEWAY_HOST": HOST, "GATEWAY_PORT": str(self.port)}
        argv = [sys.executable, "-m", "gateway", "serve"]
        self._child = Child(argv, self.log_path, cwd=REPO, env=env)
        self._starts = 0
        # Timer runs later than LAG_LIMIT_S seen at readiness (None: not known),
        # and whether the process was ever stopped on purpose (it lags then).
        self._lagged_at_start: float | None = None
        self._stalls_at_start = 0
        self._paused = False

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:21234``."""
        return f"http://{HOST}:{self.port}"

    async def start(self, within: float = 30.0) -> Self:
        """Spawn the process and wait until ``/readyz`` answers 200."""
        self._starts += 1
        self._child.spawn(banner=f"----- chaos: start #{self._starts} of gateway {self.index}")
        await self.wait_ready(within)
        self._lagged_at_start = await self._late_timers()
        self._stalls_at_start = len(self.log_events("event_loop_stalled"))
        return self

    async def _late_timers(self) -> float | None:
        """How often the loop ran its lag timer more than LAG_LIMIT_S late; None
        when that cannot be read (metrics off, process gone or not answering)."""
        try:
            found = await scrape(self.url)
        except (aiohttp.ClientError, TimeoutError):
            return None
        within = found.get(f'{LAG_BUCKETS}{{le="{LAG_LIMIT_S}"}}')
        every = found.get(f'{LAG_BUCKETS}{{le="+Inf"}}')
        return None if within is None or every is None else every - within

    async def lag_report(self) -> str | None:
        """Why this instance fails the lag check, or None: its loop ran a timer
        more than LAG_LIMIT_S late after start-up (a call blocked it). A process
        stopped on purpose (SIGSTOP) is not judged, nor one whose every stall
        was logged ``polling`` (asleep in the loop's poll, the machine's doing)."""
        if self._paused or self._lagged_at_start is None or not self.running:
            return None
        now = await self._late_timers()
        if now is None or now <= self._lagged_at_start:
            return None
        logged = self.log_events("event_loop_stalled")[self._stalls_at_start :]
        if logged and all(e.get("polling") for e in logged):
            # Found asleep in its own poll each time: the machine did not run it.
            return None
        stalls = "\n".join(str(e) for e in logged[-3:])
        return (
            f"gateway {self.index}: the event loop ran {now - self._lagged_at_start:.0f}"
            f" timer(s) more than {LAG_LIMIT_S}s late after start-up\n{stalls}"
        )

    def configure(self, settings: Mapping[str, str | int | float | None]) -> None:
        """Change settings (names as for :func:`gateway_env`) from the next start on;
        ``None`` removes one."""
        env = self._child.env if self._child.env is not None else {}
        for key, value in settings.items():
            name = key if key.startswith("GATEWAY_") else f"GATEWAY_{key.upper()}"
            if value is None:
                env.pop(name, None)
            else:
                env[name] = str(value)
        self._child.env = env

    async def wait_ready(self, within: float = 30.0) -> None:
        """Wait until ``/readyz`` is 200; fails at once, with the log, if the process exits."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as http:

            async def ready() -> bool:
                if not self._child.running:
                    raise GaveUp(
                        f"gateway {self.index} exited ({self.returncode}):\n{self.log_tail()}"
                    )
                async with http.get(f"{self.url}/readyz") as response:
                    return response.status == 200

            try:
                await wait_for(ready, within=within, what=f"gateway {self.index} /readyz")
            except TimeoutError as exc:
                raise TimeoutError(f"{exc}\n{self.log_tail()}") from None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL, SIGTERM, SIGSTOP, SIGCONT, ...) without waiting."""
        self._child.send(sig)

    def pause(self, worker: int | None = None) -> None:
        """SIGSTOP: the port still accepts connections, nothing answers. With
        ``worker``, that worker process (a pid of :meth:`workers`) alone."""
        self._paused = True
        if worker is None:
            self.kill(signal.SIGSTOP)
        else:
            os.kill(worker, signal.SIGSTOP)

    def resume(self, worker: int | None = None) -> None:
        """SIGCONT after :meth:`pause` (of the same ``worker``)."""
        if worker is None:
            self.kill(signal.SIGCONT)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGCONT)

    def workers(self) -> dict[int, int]:
        """With GATEWAY_WORKERS > 1, the worker processes the supervisor runs:
        their lane index (GATEWAY_LANE_INDEX in their environment) -> pid."""
        if self.pid is None or not self.running:
            return {}
        found = {}
        for pid in children_of(self.pid):
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                for entry in environ:
                    name, _, value = entry.partition(b"=")
                    if name == b"GATEWAY_LANE_INDEX":
                        found[int(value)] = pid
        return found

    async def wait_exit(self, within: float = 15.0) -> int:
        """Wait until the process has exited; its exit status. A timeout says
        what the instance logged last (a stuck close logs its tasks' awaits)."""
        try:
            return await self._child.wait_exit(within)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; gateway {self.index} log:\n{self.log_tail(12)}") from None

    async def crash(self) -> None:
        """SIGKILL and wait until the process is reaped."""
        await self._child.kill()

    async def stop(self, within: float = 15.0) -> int | None:
        """SIGTERM (graceful drain), SIGKILL after ``within``; the exit status."""
        await self._child.stop(signal.SIGTERM, within)
        return self.returncode

    async def restart(self, within: float = 30.0) -> None:
        """SIGKILL if still running, then start again on the same port."""
        if self.running:
            await self.crash()
        await self.start(within)

    def log_text(self) -> str:
        """The whole log of every run of this instance."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        """The end of the log."""
        return tail(self.log_path, lines)

    def log_events(self, event: str) -> list[dict[str, Any]]:
        """Every JSON log record of this instance whose event is ``event``."""
        found = []
        for line in self.log_text().splitlines():
            if f'"{event}"' in line and line.startswith("{"):
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if record.get("event") == event:
                        found.append(record)
        return found


class GatewayCluster(Started):
    """``count`` gateways sharing one Redis and one database (and key prefix).

    ``settings`` are extra GATEWAY_* settings (``{"flush_lock": "postgres"}``).
    The database is migrated once, as ``python -m gateway migrate`` would, before
    any instance starts.
    """

    def __init__(
        self,
        count: int,
        *,
        redis_url: str,
        database_url: str,
        key_prefix: str | None = None,
        admin_token: str = ADMIN_TOKEN,
        settings: Mapping[str, str | int | float] | None = None,
    ) -> None:
        self.database_url = database_url
        self.admin_token = admin_token
        self.key_prefix = key_prefix or f"chaos{uuid.uuid4().hex[:8]}"
        self.dir = make_tmp("gateways")
        self.env = gateway_env(
            {
                "redis_url": redis_url,
                "database_url": database_url,
                "key_prefix": self.key_prefix,
                "admin_token": admin_token,
                # Short drain: a SIGTERM'd instance must not hold a test for 10 s.
                "drain_s": DRAIN_S,
                # A stall the lag check fails on is logged with its stack.
                "loop_stall_report_s": LAG_LIMIT_S * 0.8,
                "log_level": "info",
                **(settings or {}),
            }
        )
        self.gateways = [Gateway(i, self.env, self.dir) for i in range(count)]

    def __getitem__(self, index: int) -> Gateway:
        return self.gateways[index]

    def __len__(self) -> int:
        return len(self.gateways)

    def __iter__(self) -> Iterator[Gateway]:
        return iter(self.gateways)

    @property
    def urls(self) -> list[str]:
        """Base URL of every instance, by index."""
        return [g.url for g in self.gateways]

    async def migrate(self, within: float = 60.0) -> list[str]:
        """Create the database if missing and apply every migration, as ``python
        -m gateway migrate`` does, in this process (the command's interpreter
        start-up cost every cluster 1.3-1.8 s; tests/e2e/test_wheel.py and
        test_misconfiguration.py run the command itself); the versions applied."""
        url = self.env["GATEWAY_DATABASE_URL"]
        async with asyncio.timeout(within):
            await ensure_database(url)
            con = await connect(url)
            try:
                return await apply_migrations(con)
            finally:
                await con.close()

    async def start(self, within: float = 30.0) -> Self:
        """Migrate, then start every instance and wait until all are ready."""
        await self.migrate()
        await asyncio.gather(*(g.start(within) for g in self.gateways))
        return self

    async def admin(self, method: str, path: str, body: Any = None, via: int = 0) -> Any:
        """An admin call through instance ``via``; the JSON answer (raises on non-2xx)."""
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        url = f"{self.gateways[via].url}{path}"
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
            http.request(method, url, json=body, headers=headers) as response,
        ):
            data = await response.json(content_type=None)
            if response.status >= 300:
                raise RuntimeError(f"{method} {path} -> {response.status} {data}")
            return data

    async def put_sku(self, sku: str, stock: int, per_user_limit: int = 1, via: int = 0) -> Any:
        """PUT /admin/skus/{sku}: create the sku or reset its stock."""
        body = {"stock": stock, "per_user_limit": per_user_limit}
        return await self.admin("PUT", f"/admin/skus/{sku}", body, via)

    async def report(self, sku: str, via: int = 0) -> Any:
        """GET /admin/skus/{sku}'s counts: db_stock, redis_stock, pending, sold."""
        answer = await self.admin("GET", f"/admin/skus/{sku}", via=via)
        return {name: answer[name] for name in ("db_stock", "redis_stock", "pending", "sold")}

    def logs(self, lines: int = 40) -> str:
        """The end of every instance's log, for failure messages."""
        return "\n".join(
            f"--- gateway {g.index} (port {g.port}, rc {g.returncode})\n{g.log_tail(lines)}"
            for g in self.gateways
        )

    def log_lines(self, needle: str) -> list[str]:
        """Every log line of every instance containing ``needle``, prefixed by the index."""
        return [
            f"[{g.index}] {line}"
            for g in self.gateways
            for line in g.log_text().splitlines()
            if needle in line
        ]

    async def close(self) -> None:
        """Stop every instance (SIGTERM, then SIGKILL) and remove the log directory;
        then fail if an instance's event loop stalled while it ran (the lag check)."""
        stalled = [r for g in self.gateways if (r := await g.lag_report()) is not None]
        await asyncio.gather(*(g.stop(within=5) for g in self.gateways))
        remove_tmp(self.dir)
        if stalled:
            raise AssertionError("event loop stalled: " + "\n".join(stalled))
