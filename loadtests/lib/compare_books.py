"""The books of one comparison round (``loadtests.compare``): units sold sampled
while it runs, then the wait for the reconciler to settle, the sold units and
stock left read in one snapshot, and ``flashsale-gateway audit``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from typing import Any

import asyncpg

from loadtests.lib.compare_round import Round
from loadtests.lib.options import REPO_ROOT
from testkit.http import http

SETTLE_S = 30.0


class SoldSampler:
    """Counts the sku's sold units in PostgreSQL every 50 ms, in a thread of its own,
    so confirmed/s is sold units over the time it took to sell them."""

    def __init__(self, database_url: str, sku: str) -> None:
        self._url = database_url
        self._sku = sku
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.curve: list[tuple[float, int]] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.run(self._sample())

    async def _sample(self) -> None:
        con = await asyncpg.connect(self._url)
        started = time.monotonic()
        try:
            while not self._stop.wait(0.05):
                sold = await con.fetchval(SOLD, self._sku)
                self.curve.append((time.monotonic() - started, int(sold or 0)))
        finally:
            await con.close()


SOLD = "SELECT coalesce(sum(qty), 0) FROM orders WHERE sku = $1"
# Units sold and stock left read in one snapshot: a purchase still committing
# while the books are read must not look like a lost unit.
BOOKS = """
SELECT (SELECT coalesce(sum(qty), 0) FROM orders WHERE sku = $1) AS sold,
       (SELECT stock FROM inventory WHERE sku = $1) AS stock
"""


def settle_and_audit(rnd: Round) -> dict[str, Any]:
    """Wait for the reconciler to settle every reservation; the books and the audit."""
    gateway = rnd.gateways[0]
    deadline = time.monotonic() + SETTLE_S
    pending: Any = None
    while time.monotonic() < deadline:
        status, body = http(
            "GET", f"{gateway.url}/admin/skus/{rnd.sku}", token=gateway.admin_token, timeout=3.0
        )
        pending = body.get("pending") if status == 200 and isinstance(body, dict) else None
        if pending == 0:
            break
        time.sleep(0.2)
    sold, db_stock = asyncio.run(_books(rnd.database_url, rnd.sku))
    env = {**rnd.settings, "GATEWAY_DATABASE_URL": rnd.database_url}
    env["GATEWAY_REDIS_URL"] = rnd.redis_url
    audit = subprocess.run(
        [sys.executable, "-m", "gateway", "audit", "--sku", rnd.sku],
        cwd=REPO_ROOT,
        env={**_base_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return {
        "pending_left": pending,
        "sold": sold,
        "db_stock": db_stock,
        "audit_exit": audit.returncode,
        "audit": audit.stdout.strip()[-1000:],
    }


async def _books(database_url: str, sku: str) -> tuple[int, int]:
    con = await asyncpg.connect(database_url)
    try:
        row = await con.fetchrow(BOOKS, sku)
    finally:
        await con.close()
    assert row is not None  # the query always returns one row
    return int(row["sold"] or 0), int(row["stock"] or 0)


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
