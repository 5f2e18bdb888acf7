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
    stores = {
        "database_url": settings.database_url,
        "redis_url": settings.redis_url,
        "key_prefix": settings.key_prefix,
    }
    return await _run_command(stores, "audit", *args)


async def run_events(settings: Settings, *args: str) -> tuple[int, str, str]:
    """Run ``python -m gateway events ARGS`` on the database of ``settings``;
    (exit code, stdout, stderr)."""
    return await _run_command({"database_url": settings.database_url}, "events", *args)


async def _run_command(stores: dict[str, str], *args: str) -> tuple[int, str, str]:
    """``python -m gateway ARGS`` with only ``stores`` of the GATEWAY_* settings."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        *args,
        env=gateway_env(stores),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
