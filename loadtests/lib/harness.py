"""A :class:`Harness` owns everything one load-test run creates, and removes it.

Bench databases, a Redis key prefix, and target subprocesses (the bare
baseline, the gateway, the naive baseline), each on a free loopback port.
Closing the harness stops every process, drops every database and deletes
every key under the prefix, whatever happened before (exception, Ctrl-C or
SIGTERM, see :func:`loadtests.lib.signals.signals_interrupt`).

Everything here is blocking, so it runs in the pytest process and in plain
scripts alike.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from loadtests.lib.options import PG_URL, REDIS_URL, REPO_ROOT, new_run_id
from loadtests.lib.pinning import Pinning
from loadtests.lib.signals import signals_deferred
from loadtests.lib.storage import delete_keys, drop_database, set_database_settings
from loadtests.lib.targets import (
    START_TIMEOUT_S,
    Target,
    gateway_put_sku,
    naive_put_sku,
    wait_ready,
)
from testkit.ports import HOST, free_port
from testkit.processes import die_with_parent, stop_process
from testkit.services import database_url

# Settings the harness decides for a gateway; any other GATEWAY_* in the
# environment (batch size, pool sizes...) passes through, for experiments.
_OWNED_SETTINGS = (
    "GATEWAY_HOST",
    "GATEWAY_PORT",
    "GATEWAY_DATABASE_URL",
    "GATEWAY_REDIS_URL",
    "GATEWAY_KEY_PREFIX",
    "GATEWAY_EVENTS_STREAM",
    "GATEWAY_ADMIN_TOKEN",
)


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
    # Where the targets run (see loadtests.lib.pinning); unpinned by default.
    pinning: Pinning = field(default_factory=lambda: Pinning(None, None))
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
        with signals_deferred():
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

    def database(self, suffix: str, source: Path | None = None) -> str:
        """Create and migrate ``flashsale_bench_<run>_<suffix>``; returns its URL.

        Migrated with ``flashsale-gateway migrate``, so the gateway and the
        naive baseline run on the very same schema; ``source`` is another
        checkout whose migrations to apply (the base of an A/B run, whose
        gateway would otherwise meet a schema and functions of this one's).
        """
        name = f"{self.db_prefix}_{self.run_id}_{suffix}"
        url = database_url(name, self.pg_url)
        # Registered first: a migration that fails half-way still gets dropped.
        self.databases.append(name)
        env = _child_env()
        if source is not None:
            env["PYTHONPATH"] = str(source)
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "migrate", "--database-url", url],
            cwd=source or REPO_ROOT,
            env=env,
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

    def start_bare(self, name: str = "bare", *, minimal: bool = False) -> Target:
        """Start the bare aiohttp baseline (``loadtests.baselines.bare``; ``minimal``:
        parsing the body only, without the gateway's validation)."""
        port = free_port()
        cmd = [sys.executable, "-m", "loadtests.baselines.bare", "--port", str(port)]
        if minimal:
            cmd.append("--minimal")
        return self._start(name, port, cmd, _child_env())

    def start_naive(self, database_url: str, name: str = "naive") -> Target:
        """Start the naive baseline (``loadtests.baselines.naive``) on ``database_url``."""
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "loadtests.baselines.naive",
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
        target.setup = naive_put_sku
        return target

    def start_gateway(
        self,
        database_url: str,
        name: str = "gateway",
        settings: Mapping[str, str] | None = None,
        source: Path | None = None,
    ) -> Target:
        """Start ``flashsale-gateway serve`` (one process) and wait until it is ready.

        ``settings`` are extra ``GATEWAY_*`` variables for this gateway; ``source``
        is another checkout whose ``gateway`` package it runs (an A/B run, see
        loadtests.bench_ab), with this one's virtualenv.
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
                # Under the run's prefix, so the run's keys go with it at the end.
                "GATEWAY_EVENTS_STREAM": f"{self.key_prefix}:{name}:events",
                "GATEWAY_ADMIN_TOKEN": token,
            }
        )
        env.setdefault("GATEWAY_DRAIN_S", "5")
        # Waiting-room skus (the waiting_room Locust profile) need admission tokens.
        env.setdefault("GATEWAY_ADMISSION_SECRET", secrets.token_hex(16))
        # One process unless asked otherwise: its pid is then the server's.
        env.setdefault("GATEWAY_WORKERS", "1")
        env.update(settings or {})
        # `python -m gateway` rather than the console script, so the pid is
        # the server's own (for /proc and py-spy) on any install layout.
        cmd = [sys.executable, "-m", "gateway", "serve"]
        if source is not None:
            env["PYTHONPATH"] = str(source)
        target = self._start(name, port, cmd, env, ready_path="/readyz", cwd=source or REPO_ROOT)
        target.admin_token = token
        target.setup = gateway_put_sku
        return target

    def _start(
        self,
        name: str,
        port: int,
        cmd: list[str],
        env: dict[str, str],
        ready_path: str = "/healthz",
        cwd: Path = REPO_ROOT,
    ) -> Target:
        assert self.log_dir is not None, "use the Harness as a context manager"
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                self.pinning.server_command(cmd),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: Ctrl-C reaches the harness only, which then
                # stops targets in order instead of all at once.
                start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM),
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
