"""One round of ``loadtests.bench_stack``: a fresh gateway and database, in-stock
load, the relay's catch-up, and what every process of the stack spent.

A round creates its own database (so every round's tables start empty and no
earlier round's rows are vacuumed in its window), starts a gateway on it with
the round's settings, creates the in-stock sku, warms the gateway up, waits
for the relay to deliver the warm-up's events, then measures: CPU snapshots of
the gateway, the PostgreSQL cluster and Redis, wrk for the load's seconds, the
catch-up's seconds, snapshots again; the orders made are counted in
PostgreSQL. The gateway is stopped and the database dropped at the end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import redis

from loadtests.lib import proc_cpu, wrk
from loadtests.lib.harness import Harness
from loadtests.lib.pinning import Pinning
from loadtests.lib.stack_profile import profiling
from loadtests.lib.stack_servers import Stack
from loadtests.lib.storage import drop_database
from loadtests.lib.stream_lag import percentiles, read_lags
from loadtests.lib.targets import Target
from testkit.processes import stop_process

SKU = "bench-stack"
# The warm-up's events delivered before the measured window opens, within this.
DRAIN_S = 15.0


@dataclass(frozen=True, slots=True)
class RoundPlan:
    """What one stack round does."""

    mode: str
    round: int
    settings: Mapping[str, str]
    stock: int
    warmup_s: float
    load_s: float
    catchup_s: float
    connections: int
    relayed: bool
    statements: bool = False
    profile_dir: Path | None = None
    # Seconds of the stack measured idle, the warm-up's events delivered and
    # before the load: what a gateway costs between sales (0: not measured).
    idle_s: float = 0.0


@dataclass
class RoundResult:
    """What one stack round measured (all CPU in seconds over the window)."""

    mode: str
    round: int
    started_at: float
    orders: int
    wrk: wrk.WrkResult
    cpu_s: dict[str, dict[str, float]]
    redis_commands_us: dict[str, float]
    owed_after: int
    lag_ms: dict[str, float] = field(default_factory=dict)
    statements: list[dict[str, Any]] = field(default_factory=list)
    # Purchases per flush over the window (the gateway's flashsale_batch_size).
    mean_batch: float = 0.0
    # Warnings and errors the gateway logged, by event (a relay that fell
    # behind says why here).
    problems: dict[str, int] = field(default_factory=dict)
    # Each process's CPU while the stack was idle, ms a second (RoundPlan.idle_s).
    idle_ms_s: dict[str, float] = field(default_factory=dict)

    def per_order_us(self, group: str) -> float:
        """µs of CPU per order of one group (gateway, postgres, redis)."""
        return sum(self.cpu_s[group].values()) / self.orders * 1e6 if self.orders else 0.0

    def as_json(self) -> dict[str, Any]:
        """For the results file."""
        return {
            "mode": self.mode,
            "round": self.round,
            "started_at": self.started_at,
            "orders": self.orders,
            "wrk": self.wrk.as_json(),
            "cpu_s": self.cpu_s,
            "redis_commands_us": self.redis_commands_us,
            "owed_after": self.owed_after,
            "lag_ms": self.lag_ms,
            "statements": self.statements,
            "mean_batch": self.mean_batch,
            "problems": self.problems,
            "idle_ms_s": self.idle_ms_s,
        }


def run_round(harness: Harness, stack: Stack, plan: RoundPlan, pinning: Pinning) -> RoundResult:
    """Run ``plan`` on a fresh database and gateway; both removed afterwards."""
    name = f"{plan.mode}{plan.round}"
    url = harness.database(name)
    db_name = harness.databases[-1]
    gateway = harness.start_gateway(url, name=name, settings=plan.settings)
    try:
        gateway.put_sku(SKU, plan.stock)
        if plan.warmup_s > 0:
            _wrk(gateway, f"{harness.run_id}{name}w", plan.warmup_s, plan, pinning)
        _drain(url)
        idle = _idle(gateway, stack, plan.idle_s) if plan.idle_s > 0 else {}
        stream = f"{harness.key_prefix}:{name}:events"
        result = _measure(
            gateway, stack, url, db_name, stream, plan, pinning, f"{harness.run_id}{name}"
        )
        result.idle_ms_s = idle
        return result
    finally:
        stop_process(gateway.process)
        harness.targets.remove(gateway)
        drop_database(db_name, stack.pg_url)
        harness.databases.remove(db_name)


def _roots(gateway: Target, stack: Stack) -> dict[str, int]:
    """The process (tree) of each group whose CPU is measured."""
    return {"gateway": gateway.pid, "postgres": stack.pg_pid, "redis": stack.redis_pid}


def _idle(gateway: Target, stack: Stack, seconds: float) -> dict[str, float]:
    """Each process's CPU over ``seconds`` of no load, in ms a second."""
    roots = _roots(gateway, stack)
    before = {group: proc_cpu.snapshot(pid) for group, pid in roots.items()}
    time.sleep(seconds)
    after = {group: proc_cpu.snapshot(pid) for group, pid in roots.items()}
    return {
        group: sum(proc_cpu.spent(before[group], after[group]).values()) / seconds * 1e3
        for group in roots
    }


def _measure(
    gateway: Target,
    stack: Stack,
    db_url: str,
    db_name: str,
    stream: str,
    plan: RoundPlan,
    pinning: Pinning,
    tag: str,
) -> RoundResult:
    roots = _roots(gateway, stack)
    window = plan.load_s + plan.catchup_s
    orders_before = _orders(db_url)
    commands_before = _command_usec(stack.redis_url)
    if plan.statements:
        _statements(stack.pg_url, None)
    batches_before = gateway.scrape("flashsale_batch_size")
    started = time.time()
    before = {group: proc_cpu.snapshot(pid) for group, pid in roots.items()}
    name = f"{plan.mode}{plan.round}"
    with profiling(plan.profile_dir, name, gateway.pid, pinning, window):
        raw = _wrk(gateway, tag, plan.load_s, plan, pinning)
        time.sleep(plan.catchup_s)
    after = {group: proc_cpu.snapshot(pid) for group, pid in roots.items()}
    ended = time.time()
    commands = _delta(commands_before, _command_usec(stack.redis_url))
    # Read once the window is closed: the reading costs the measured stack nothing.
    lag = percentiles(read_lags(stack.redis_url, stream, started, ended)) if plan.relayed else {}
    batches = _delta(batches_before, gateway.scrape("flashsale_batch_size"))
    flushes = batches.get("flashsale_batch_size_count", 0.0)
    if gateway.process.poll() is not None:
        raise RuntimeError(f"{gateway.name} died under load:\n{gateway.log_tail()}")
    cpu_s = {
        "gateway": {"gateway": sum(proc_cpu.spent(before["gateway"], after["gateway"]).values())},
        "postgres": proc_cpu.spent(before["postgres"], after["postgres"], _pg_label(stack.pg_pid)),
        "redis": {"redis": sum(proc_cpu.spent(before["redis"], after["redis"]).values())},
    }
    return RoundResult(
        mode=plan.mode,
        round=plan.round,
        started_at=started,
        orders=_orders(db_url) - orders_before,
        wrk=wrk.to_result(plan.mode, "in_stock", plan.round, raw, started),
        cpu_s=cpu_s,
        redis_commands_us=commands,
        owed_after=_owed(db_url),
        lag_ms=lag,
        statements=_statements(stack.pg_url, db_name) if plan.statements else [],
        mean_batch=batches.get("flashsale_batch_size_sum", 0.0) / flushes if flushes else 0.0,
        problems=gateway.log_problems(),
    )


def _wrk(
    target: Target, tag: str, seconds: float, plan: RoundPlan, pinning: Pinning
) -> dict[str, Any]:
    return wrk.run(
        target.url,
        sku=SKU,
        tag=tag,
        duration_s=seconds,
        connections=plan.connections,
        threads=1,
        pinning=pinning,
    )


def _pg_label(postmaster: int) -> Any:
    """PostgreSQL's processes by role: the client backends together (which of the
    gateway's connections runs a flush changes from flush to flush; the
    statements' split is pg_stat_statements'), each background process by its
    title (``postgres: walwriter``)."""

    def label(pid: int, title: str) -> str:
        if pid == postmaster:
            return "postmaster"
        role = title.removeprefix("postgres: ").strip()
        # A client backend's title: "<user> <database> <host>(<port>) <state>".
        if "(" in role and ")" in role:
            return "client backends"
        return role or title

    return label


STATEMENTS = """
SELECT s.toplevel, s.calls, s.rows, s.total_exec_time, s.query
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = $1 ORDER BY s.total_exec_time DESC LIMIT 40
"""


def _statements(server_url: str, database: str | None) -> list[dict[str, Any]]:
    """pg_stat_statements of ``database`` since the last reset (None: reset now)."""

    async def read() -> list[dict[str, Any]]:
        con = await asyncpg.connect(server_url, timeout=5)
        try:
            if database is None:
                await con.execute("SELECT pg_stat_statements_reset()")
                return []
            rows = await con.fetch(STATEMENTS, database)
        finally:
            await con.close()
        return [
            {
                "toplevel": row["toplevel"],
                "calls": row["calls"],
                "rows": row["rows"],
                "exec_ms": round(row["total_exec_time"], 3),
                "query": " ".join(row["query"].split())[:160],
            }
            for row in rows
        ]

    return asyncio.run(read())


def _fetchval(url: str, query: str) -> int:
    async def read() -> int:
        con = await asyncpg.connect(url, timeout=5)
        try:
            return int(await con.fetchval(query, timeout=30))
        finally:
            await con.close()

    return asyncio.run(read())


def _orders(url: str) -> int:
    return _fetchval(url, "SELECT count(*) FROM orders")


def _owed(url: str) -> int:
    return _fetchval(url, "SELECT count(*) FROM events_owed")


def _drain(url: str) -> None:
    """Wait (at most DRAIN_S) until no event is owed: the warm-up's are delivered."""
    deadline = time.monotonic() + DRAIN_S
    while _owed(url) and time.monotonic() < deadline:
        time.sleep(0.1)


def _command_usec(url: str) -> dict[str, float]:
    """Redis's own µs per command so far (``INFO commandstats``)."""
    client = redis.Redis.from_url(url, socket_timeout=5.0)
    try:
        stats: dict[str, Any] = client.info("commandstats")
    finally:
        client.close()
    return {
        key.removeprefix("cmdstat_"): float(value["usec"])
        for key, value in stats.items()
        if isinstance(value, dict) and "usec" in value
    }


def _delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
