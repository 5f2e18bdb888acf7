"""What ``loadtests.bench_lifecycle`` reads besides the buyers' answers: CPU of the
gateway and of its PostgreSQL backends, the return-lag histogram of ``/metrics``,
and a sku's books in PostgreSQL (blocking calls, for a plain script)."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import asyncpg

from loadtests.lib.cputime import run_and_queued
from loadtests.lib.targets import Target
from testkit.http import http
from testkit.metrics import samples

RETURN_LAG = "flashsale_order_return_lag_seconds"
BACKENDS = """
SELECT pid FROM pg_stat_activity WHERE datname = current_database()
    AND backend_type = 'client backend' AND pid <> pg_backend_pid()
"""


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    """CPU seconds run so far by the gateway and by each PostgreSQL client backend
    of its database, autovacuum left out (``/proc/<pid>/task/*/schedstat``:
    nanoseconds, not clock ticks)."""

    gateway: float
    backends: Mapping[int, float]

    def since(self, before: CpuSnapshot) -> tuple[float, float]:
        """(gateway, PostgreSQL) CPU seconds between ``before`` and this; a backend
        that started in between counts from zero, one that ended is lost."""
        pg = sum(ran - before.backends.get(pid, 0.0) for pid, ran in self.backends.items())
        return self.gateway - before.gateway, pg


def cpu_snapshot(gateway: Target, database_url: str) -> CpuSnapshot:
    """The gateway's and its database's backends' CPU now."""

    async def backends() -> list[int]:
        con = await asyncpg.connect(database_url)
        try:
            return [r["pid"] for r in await con.fetch(BACKENDS)]
        finally:
            await con.close()

    found = {}
    for pid in asyncio.run(backends()):
        ran = run_and_queued(pid)
        if ran is not None:
            found[pid] = ran[0]
    own = run_and_queued(gateway.pid)
    return CpuSnapshot(own[0] if own else 0.0, found)


def lag_buckets(gateway: Target) -> dict[float, float]:
    """The return-lag histogram of ``/metrics``: upper bound -> cumulative count."""
    status, body = http("GET", f"{gateway.url}/metrics", timeout=10.0)
    if status != 200 or not isinstance(body, str):
        raise RuntimeError(f"GET /metrics answered {status}")
    found: dict[float, float] = {}
    for series, value in samples(body).items():
        if series.startswith(f"{RETURN_LAG}_bucket{{"):
            bound = series.split('le="', 1)[1].split('"', 1)[0]
            found[math.inf if bound == "+Inf" else float(bound)] = value
    return found


def bucket_quantile(buckets: Mapping[float, float], q: float) -> float | None:
    """The smallest bucket bound holding a share ``q`` of the observations: the
    quantile is at most this (None: no observation)."""
    total = max(buckets.values(), default=0.0)
    if total <= 0:
        return None
    for bound in sorted(buckets):
        if buckets[bound] >= q * total:
            return bound
    return math.inf


def minus(after: Mapping[float, float], before: Mapping[float, float]) -> dict[float, float]:
    """The observations of a histogram made between two scrapes."""
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max of ``values`` (empty: none)."""
    if not values:
        return {}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return {"p50": statistics.median(ordered), "p99": p99, "max": ordered[-1], "n": len(ordered)}


BOOKS = """
SELECT
    (SELECT stock FROM inventory WHERE sku = $1) AS stock,
    (SELECT json_object_agg(status, n) FROM
        (SELECT status, count(*) AS n FROM orders WHERE sku = $1 GROUP BY status) s) AS orders,
    (SELECT json_object_agg(reason, json_build_array(n, units)) FROM
        (SELECT reason, count(*) AS n, sum(delta) AS units FROM stock_movements
         WHERE sku = $1 GROUP BY reason) m) AS movements,
    (SELECT count(*) FROM late_payments l JOIN orders o USING (request_id)
     WHERE o.sku = $1) AS late_payments,
    (SELECT count(*) FROM orders WHERE sku = $1 AND status IN ('expired', 'cancelled')
     AND synced_at IS NULL) AS owed
"""
OUTSTANDING = """
SELECT count(*) FROM orders WHERE sku = $1 AND (status = 'pending_payment'
    OR (status IN ('expired', 'cancelled') AND synced_at IS NULL))
"""


def books(database_url: str, sku: str) -> dict[str, object]:
    """A sku's stock, orders by status, movements by reason (rows, units), late
    payments and returns still owed to Redis."""

    async def read() -> dict[str, object]:
        con = await asyncpg.connect(database_url)
        try:
            await con.set_type_codec("json", encoder=str, decoder=json.loads, schema="pg_catalog")
            row = await con.fetchrow(BOOKS, sku)
        finally:
            await con.close()
        assert row is not None
        return {k: {} if v is None else v for k, v in row.items()}

    return asyncio.run(read())


async def outstanding(con: asyncpg.Connection, sku: str) -> int:
    """Orders of ``sku`` still pending, or closed with their units not yet in Redis."""
    value: int = await con.fetchval(OUTSTANDING, sku)
    return value
