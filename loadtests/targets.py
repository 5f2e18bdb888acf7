"""Start-up and clean-up of load-test targets, shared by the bench, Locust and tests.

A :class:`Harness` owns everything one run creates: bench databases, a Redis
key prefix, and target subprocesses (the bare baseline, the gateway, the naive
baseline), each on a free loopback port. Closing it stops every process,
drops every database and deletes every key under the prefix, whatever
happened before (exception, Ctrl-C or SIGTERM, see :func:`signals_interrupt`).

Everything here is synchronous and standard library apart from the database
and Redis clean-up, so it can run in the pytest process and in plain scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import redis

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "loadtests" / "results"
HOST = "127.0.0.1"
PG_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
POLL_S = 0.05
# Settings the harness decides for a gateway; any other GATEWAY_* in the
# environment (batch size, pool sizes...) passes through, for experiments.
_OWNED_SETTINGS = (
    "GATEWAY_HOST",
    "GATEWAY_PORT",
    "GATEWAY_DATABASE_URL",
    "GATEWAY_REDIS_URL",
    "GATEWAY_KEY_PREFIX",
    "GATEWAY_ADMIN_TOKEN",
)
# urllib honours http_proxy; the harness only ever talks to loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def parse_seconds(raw: str) -> float:
    """``"10"``, ``"10s"``, ``"1.5s"`` or ``"2m"`` in seconds."""
    raw = raw.strip().lower()
    if raw.endswith("m"):
        return float(raw[:-1]) * 60
    return float(raw.removesuffix("s"))


def new_run_id() -> str:
    """A short id that names this run's databases and Redis keys."""
    return uuid.uuid4().hex[:8]


def free_port(host: str = HOST) -> int:
    """A TCP port free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def database_url(name: str, server_url: str = PG_URL) -> str:
    """The URL of database ``name`` on the server of ``server_url``."""
    return urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))


def drop_database(name: str, server_url: str = PG_URL) -> None:
    """Drop database ``name`` if it exists, disconnecting whoever is still in it."""

    async def drop() -> None:
        con = await asyncpg.connect(server_url)
        try:
            quoted = '"' + name.replace('"', '""') + '"'
            await con.execute(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")
        finally:
            await con.close()

    asyncio.run(drop())


def set_database_settings(name: str, settings: Mapping[str, str], server_url: str = PG_URL) -> None:
    """``ALTER DATABASE name SET key = value`` for each setting (new sessions see them)."""

    async def alter() -> None:
        con = await asyncpg.connect(server_url)
        try:
            quoted = '"' + name.replace('"', '""') + '"'
            for key, value in settings.items():
                if not key.replace("_", "").replace(".", "").isalnum():
                    raise ValueError(f"not a setting name: {key!r}")
                literal = "'" + value.replace("'", "''") + "'"
                await con.execute(f"ALTER DATABASE {quoted} SET {key} = {literal}")
        finally:
            await con.close()

    asyncio.run(alter())


def parse_settings(raw: str) -> dict[str, str]:
    """``"a=1,b=x"`` to ``{"a": "1", "b": "x"}`` (empty string: none)."""
    pairs = (item.partition("=") for item in raw.split(",") if item.strip())
    return {k.strip(): v.strip() for k, _, v in pairs}


def delete_keys(prefix: str, redis_url: str = REDIS_URL) -> int:
    """Delete every Redis key under ``prefix:``; returns how many."""
    client = redis.Redis.from_url(redis_url)
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += client.unlink(*batch)
                batch.clear()
        if batch:
            deleted += client.unlink(*batch)
    finally:
        client.close()
    return deleted


def http(
    method: str,
    url: str,
    body: Mapping[str, Any] | None = None,
    *,
    token: str | None = None,
    timeout: float = 5.0,
) -> tuple[int, Any]:
    """One JSON request; returns (status, parsed body or None). No proxies."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:  # closes its response, or it warns when collected
            status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process in KiB, from /proc.

    With child processes (``GATEWAY_WORKERS`` > 1: a supervisor and its
    workers) also ``tree_VmRSS``, the sum over the process and its descendants.
    """
    found = _status_kib(pid)
    descendants = _descendants(pid)
    if descendants:
        found["tree_VmRSS"] = found.get("VmRSS", 0) + sum(
            _status_kib(child).get("VmRSS", 0) for child in descendants
        )
    return found


def _status_kib(pid: int) -> dict[str, int]:
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0])
    return found


def _descendants(pid: int, limit: int = 256) -> list[int]:
    """Child processes, recursively (at most ``limit``), from /proc/*/task/*/children."""
    found: list[int] = []
    queue = [pid]
    while queue and len(found) < limit:
        parent = queue.pop()
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{parent}/task").iterdir():
                children = [int(c) for c in (task / "children").read_text().split()]
                found += children
                queue += children
    return found[:limit]


def parse_metrics(text: str, prefix: str = "flashsale_") -> dict[str, float]:
    """Prometheus exposition text to {name: value summed over labels}, for ``prefix*``."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        series, _, value = line.rpartition(" ")
        name = series.partition("{")[0]
        try:
            values[name] = values.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return values


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the harness dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


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
        return parse_metrics(body, prefix)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's output, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

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


def _gateway_put_sku(target: Target, sku: str, stock: int) -> None:
    status, body = http(
        "PUT",
        f"{target.url}/admin/skus/{sku}",
        {"stock": stock, "per_user_limit": 1},
        token=target.admin_token,
    )
    if status != 200:
        raise RuntimeError(f"{target.name}: PUT /admin/skus/{sku} answered {status}: {body}")


def _naive_put_sku(target: Target, sku: str, stock: int) -> None:
    status, body = http("PUT", f"{target.url}/admin/skus/{sku}", {"stock": stock})
    if status != 200:
        raise RuntimeError(f"{target.name}: PUT /admin/skus/{sku} answered {status}: {body}")


class _Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C so every ``finally`` runs."""


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into KeyboardInterrupt for the duration."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise _Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Block SIGINT, SIGTERM and SIGHUP in this thread; pending ones arrive on exit."""
    deferred = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, deferred)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@dataclass
class Harness:
    """Owns one run's databases, Redis keys and subprocesses; use as a context manager.

    ``run_id`` names everything: databases ``flashsale_bench_<run_id>_<suffix>``
    and Redis keys under ``fsbench<run_id>:``. Logs go to ``log_dir`` (a
    temporary directory by default, removed on a clean exit and kept, with its
    path printed, after a failure).
    """

    run_id: str = field(default_factory=new_run_id)
    pg_url: str = PG_URL
    redis_url: str = REDIS_URL
    log_dir: Path | None = None
    db_prefix: str = "flashsale_bench"
    # PostgreSQL settings of the run's databases (ALTER DATABASE ... SET), for
    # experiments such as plan_cache_mode=force_custom_plan.
    db_settings: dict[str, str] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    databases: list[str] = field(default_factory=list)
    _own_log_dir: bool = False

    @property
    def key_prefix(self) -> str:
        """The Redis key prefix of the run; targets add their own part after ``:``."""
        return f"fsbench{self.run_id}"

    def __enter__(self) -> Harness:
        if self.log_dir is None:
            self.log_dir = Path(tempfile.mkdtemp(prefix=f"flashsale-bench-{self.run_id}-"))
            self._own_log_dir = True
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.close(failed=exc_type is not None)

    def close(self, *, failed: bool = False) -> None:
        """Stop every target, drop every database, delete the run's keys.

        A second Ctrl-C or SIGTERM waits until this is done (it is delivered
        afterwards), so an impatient user cannot leave half a run behind.
        """
        with _signals_deferred():
            self._close(failed)

    def _close(self, failed: bool) -> None:
        # Each step runs even if an earlier one fails: nothing may leak.
        errors: list[str] = []
        for target in reversed(self.targets):
            try:
                stop_process(target.process)
            except Exception as exc:  # keep cleaning up: nothing may leak
                errors.append(f"stop {target.name}: {exc}")
        self.targets.clear()
        for name in reversed(self.databases):
            try:
                drop_database(name, self.pg_url)
            except Exception as exc:
                errors.append(f"drop database {name}: {exc}")
        self.databases.clear()
        try:
            delete_keys(self.key_prefix, self.redis_url)
        except Exception as exc:
            errors.append(f"delete keys {self.key_prefix}:*: {exc}")
        if self.log_dir is not None and self._own_log_dir:
            if failed or errors:
                print(f"harness: logs kept in {self.log_dir}", file=sys.stderr)
            else:
                shutil.rmtree(self.log_dir, ignore_errors=True)
        for error in errors:
            print(f"harness: clean-up failed: {error}", file=sys.stderr)

    def database(self, suffix: str) -> str:
        """Create and migrate ``flashsale_bench_<run>_<suffix>``; returns its URL.

        Migrated with ``flashsale-gateway migrate``, so the gateway and the
        naive baseline run on the very same schema.
        """
        name = f"{self.db_prefix}_{self.run_id}_{suffix}"
        url = database_url(name, self.pg_url)
        # Registered first: a migration that fails half-way still gets dropped.
        self.databases.append(name)
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "migrate", "--database-url", url],
            cwd=REPO_ROOT,
            env=_child_env(),
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"migrate {name} failed: {result.stderr.strip()[-2000:]}")
        if self.db_settings:
            set_database_settings(name, self.db_settings, self.pg_url)
        return url

    def start_bare(self, name: str = "bare") -> Target:
        """Start the bare aiohttp baseline (``loadtests.baseline``)."""
        port = free_port()
        cmd = [sys.executable, "-m", "loadtests.baseline", "--port", str(port)]
        return self._start(name, port, cmd, _child_env())

    def start_naive(self, database_url: str, name: str = "naive") -> Target:
        """Start the naive baseline (``loadtests.naive``) on ``database_url``."""
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "loadtests.naive",
            "--port",
            str(port),
            "--database-url",
            database_url,
            "--redis-url",
            self.redis_url,
            "--prefix",
            f"{self.key_prefix}:{name}",
        ]
        target = self._start(name, port, cmd, _child_env())
        target.setup = _naive_put_sku
        return target

    def start_gateway(
        self, database_url: str, name: str = "gateway", settings: Mapping[str, str] | None = None
    ) -> Target:
        """Start ``flashsale-gateway serve`` (one process) and wait until it is ready.

        ``settings`` are extra ``GATEWAY_*`` variables for this gateway.
        """
        port = free_port()
        token = secrets.token_urlsafe(16)
        env = _child_env(passthrough=True)
        env.update(
            {
                "GATEWAY_HOST": HOST,
                "GATEWAY_PORT": str(port),
                "GATEWAY_DATABASE_URL": database_url,
                "GATEWAY_REDIS_URL": self.redis_url,
                "GATEWAY_KEY_PREFIX": f"{self.key_prefix}:{name}",
                "GATEWAY_ADMIN_TOKEN": token,
            }
        )
        env.setdefault("GATEWAY_DRAIN_S", "5")
        # One process unless asked otherwise: its pid is then the server's.
        env.setdefault("GATEWAY_WORKERS", "1")
        env.update(settings or {})
        # `python -m gateway` rather than the console script, so the pid is
        # the server's own (for /proc and py-spy) on any install layout.
        cmd = [sys.executable, "-m", "gateway", "serve"]
        target = self._start(name, port, cmd, env, ready_path="/readyz")
        target.admin_token = token
        target.setup = _gateway_put_sku
        return target

    def _start(
        self,
        name: str,
        port: int,
        cmd: list[str],
        env: dict[str, str],
        ready_path: str = "/healthz",
    ) -> Target:
        assert self.log_dir is not None, "use the Harness as a context manager"
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                cmd,
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: Ctrl-C reaches the harness only, which then
                # stops targets in order instead of all at once.
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        target = Target(name, port, process, log_path)
        self.targets.append(target)
        wait_ready(target, ready_path)
        return target


def passthrough_settings() -> dict[str, str]:
    """The GATEWAY_* variables a started gateway inherits, secrets masked (for results)."""
    env = _child_env(passthrough=True)
    return {
        k: "***" if any(word in k for word in ("TOKEN", "PASSWORD", "SECRET")) else v
        for k, v in sorted(env.items())
        if k.startswith("GATEWAY_")
    }


def _child_env(*, passthrough: bool = False) -> dict[str, str]:
    """The environment of a child: ours, without the settings the harness decides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_") or passthrough}
    for key in _OWNED_SETTINGS:
        env.pop(key, None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def wait_ready(target: Target, path: str = "/healthz", timeout: float = START_TIMEOUT_S) -> None:
    """Poll ``path`` until it answers 200; raises if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        code = target.process.poll()
        if code is not None:
            raise RuntimeError(
                f"{target.name} exited with {code} while starting:\n{target.log_tail()}"
            )
        try:
            status, body = http("GET", f"{target.url}{path}", timeout=1.0)
        except OSError as exc:
            last = str(exc)
        else:
            if status == 200:
                return
            last = f"{status} {body}"
        time.sleep(POLL_S)
    raise RuntimeError(
        f"{target.name} not ready on {path} after {timeout:.0f}s ({last}):\n{target.log_tail()}"
    )


def stop_process(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S) -> int | None:
    """SIGTERM, wait up to ``timeout`` for a graceful exit, then SIGKILL; returns the code."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(5)
    return process.returncode
