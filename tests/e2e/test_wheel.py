"""The wheel as a new user gets it: built, installed into a fresh virtualenv, run
from a directory outside the repository.

The wheel is built offline from a copy of the sources (``pip wheel
--no-build-isolation`` with the dev venv's setuptools) and installed by the
dev venv's pip, with its dependencies at the lock's versions (as the image
installs them) from the index the Makefile's pip uses, into a virtualenv (with
no pip of its own) made once per session.
Nothing of the repository is on that interpreter's path, so the Lua scripts
and SQL migrations must come from the wheel itself.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from testkit.gateways import REPO, gateway_env
from testkit.polling import wait_for
from testkit.ports import HOST, free_port
from testkit.processes import Child
from testkit.services import REDIS_URL, drop_database

# What the wheel is built from: the package's sources and its metadata.
SOURCES = ("pyproject.toml", "README.md", "gateway", "lua", "sql")
ADMIN_TOKEN = "wheel-admin-token"


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> str:
    """Run a command to completion; its output (asserts exit status 0)."""
    result = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(argv)} failed ({result.returncode}):\n{output}"
    return output


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv (no system site-packages) with the built wheel installed;
    its ``bin`` directory."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(REPO / name, src / name)
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), "."], src)
    [wheel] = (root / "dist").glob("flashsale_gateway-*.whl")
    # Without a pip of its own: ensurepip (5 s) and that older pip's install
    # (8 s, against 5 s) were most of this set-up; the dev venv's pip installs
    # into it instead (--python), from the same index and lock.
    _run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], root)
    bin_dir = root / "venv" / "bin"
    lock = str(REPO / "requirements.lock")
    _run([*pip, "--python", str(bin_dir / "python"), "install", "-q", "-c", lock, str(wheel)], root)
    yield bin_dir


@pytest.fixture
def wheel_env() -> Iterator[dict[str, str]]:
    """GATEWAY_* settings on a database of its own (dropped afterwards)."""
    name = f"flashsale_wheel_{uuid.uuid4().hex[:8]}"
    env = gateway_env(
        {
            "database_url": f"postgresql://postgres@{HOST}:5432/{name}",
            "redis_url": REDIS_URL,
            "key_prefix": f"whl{uuid.uuid4().hex[:8]}",
            "admin_token": ADMIN_TOKEN,
            "port": free_port(),
        }
    )
    # Nothing of the repository may leak in through the environment.
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    yield env
    asyncio.run(drop_database(name))


async def _command(cli: str, command: str, cwd: Path, env: dict[str, str]) -> str:
    """Run ``flashsale-gateway COMMAND`` to completion; its stdout (asserts status 0)."""
    result = await asyncio.to_thread(
        subprocess.run, [cli, command], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


async def _buy_once(url: str, sku: str) -> tuple[int, int]:
    """Create ``sku`` with one unit and buy it; (admin status, purchase status)."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        put = {"stock": 1}
        async with http.put(f"{url}/admin/skus/{sku}", json=put, headers=headers) as resp:
            created = resp.status
        body = {"sku": sku, "user_id": "u1", "request_id": f"{sku}.1"}
        async with http.post(f"{url}/v1/purchase", json=body) as resp:
            return created, resp.status


async def test_installed_wheel_migrates_serves_and_audits(
    wheel_venv: Path, wheel_env: dict[str, str], tmp_path: Path
) -> None:
    """From outside the repository the installed command migrates a fresh database,
    serves one purchase (201), stops on SIGTERM with status 0, and audits clean."""
    assert not (tmp_path / "gateway").exists()
    cli = str(wheel_venv / "flashsale-gateway")
    migrated = await _command(cli, "migrate", tmp_path, wheel_env)
    assert "001_schema" in migrated and "functions/flush_batch" in migrated
    server = Child([cli, "serve"], tmp_path / "serve.log", cwd=tmp_path, env=wheel_env)
    server.spawn()
    url = f"http://{HOST}:{wheel_env['GATEWAY_PORT']}"
    try:

        async def ready() -> bool:
            async with aiohttp.ClientSession() as http, http.get(f"{url}/readyz") as resp:
                return resp.status == 200

        await wait_for(ready, within=30, what="the installed gateway's /readyz")
        assert await _buy_once(url, "wheel-sku") == (200, 201)
        server.send(signal.SIGTERM)
        assert await server.wait_exit(within=15) == 0
    finally:
        await server.kill()
    log = (tmp_path / "serve.log").read_text()
    assert str(REPO) not in log and "Traceback" not in log, log
    audited = await _command(cli, "audit", tmp_path, wheel_env)
    assert "wheel-sku" in audited and " ok" in audited


def test_the_venv_is_fresh(wheel_venv: Path) -> None:
    """The wheel's interpreter sees neither the repository nor the dev venv: its
    ``gateway`` and Lua scripts are the installed copies."""
    probe = (
        "import gateway, gateway.redis.scripts as s, gateway.postgres.database as d, sys;"
        "print(gateway.__file__); print(s.LUA_DIR); print(d.SQL_DIR);"
        "print(any('site-packages' in p and '.venv' in p for p in sys.path))"
    )
    out = subprocess.run(
        [str(wheel_venv / "python"), "-c", probe],
        cwd="/",
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    venv = str(wheel_venv.parent)
    assert all(line.startswith(venv) for line in out[:3]), out
    assert out[3] == "False"
