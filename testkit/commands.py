"""The ``flashsale-gateway`` command line, run as a subprocess of the tests."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from gateway.settings import Settings
from testkit.gateways import gateway_env

REPO = Path(__file__).resolve().parents[1]


async def run_audit(settings: Settings, *args: str) -> tuple[int, str, str]:
    """Run ``python -m gateway audit ARGS`` on the stores of ``settings`` (database,
    Redis, key prefix; no other GATEWAY_* inherited); (exit code, stdout, stderr)."""
    env = gateway_env(
        {
            "database_url": settings.database_url,
            "redis_url": settings.redis_url,
            "key_prefix": settings.key_prefix,
        }
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "audit",
        *args,
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def run_events(settings: Settings, *args: str) -> tuple[int, str, str]:
    """Run ``python -m gateway events ARGS`` on the database of ``settings``;
    (exit code, stdout, stderr)."""
    env = gateway_env({"database_url": settings.database_url})
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "events",
        *args,
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
