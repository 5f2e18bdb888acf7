"""One hot row's drain: the orders a second one sku's flush path commits.

    python -m loadtests.bench_flush [--rounds 5] [--batches 32,64,128,256,512]
        [--orders 4096] [--modes per-batch,slice,none] [--no-pin] [--out PATH]
        [--pg-url URL] [--redis-url URL] [--outbox on|off]

The gateway's own flush path, in this process, on a database and a Redis key
prefix of its own (``loadtests.lib.harness``, removed at the end): the
:class:`~gateway.write.flusher.Flusher` takes the sku's flush lock (a
``RedisLock`` on the shared Redis, ``GATEWAY_FLUSH_LOCK=redis``), makes its one
``flush_batch()`` call (the guarded conditional UPDATE and the order inserts,
committed) and settles the batch with ``settle.lua``. Each drain first reserves
``--orders`` purchases (in whole batches) of a new sku in Redis with ``reserve.lua`` (a new buyer
each, one unit, the sku's stock exactly that), untimed; then hands them to the
Flusher back to back in batches of B, timed from the first flush to the last,
and checks that every one was confirmed, the ledger is empty and the database
sold them all.

The lock is taken three ways (``--modes``): ``per-batch`` acquires and
releases it around every batch (a lane that runs empty after each flush, or a
lock handed to another instance every batch), ``slice`` is the Flusher's rule
under a backlog (kept across flushes for ``HOLD_SLICE_S``, 50 ms) and ``none``
takes none: the row's own time. The lock, the SQL and the settle are timed by
thin wrappers around the Flusher's collaborators; the CPU of this process, of
the database's backends and of the Redis server comes from
``/proc/<pid>/task/*/schedstat``, with this process's time waiting for a core.

Every (mode, batch size) is one drain per round; ``--rounds`` interleaved
rounds, the order shifted each round, after one untimed batch of each. The
bench runs on uvloop with the gateway's collector thresholds, on the servers'
core (``loadtests.lib.pinning``: core 1 of two); PostgreSQL and Redis are the
shared servers, left where the kernel puts them. It prints two Markdown tables
and writes ``loadtests/results/flush.json``.

``--outbox`` (issue 32): ``on`` (the default) flushes as a gateway does, each
order's event written by the triggers on ``orders`` and owed to the ``stream``
sink (no relay runs, so the backlog grows as during a long outage);
``events`` writes the events but owes them to no sink
(``sql/010_order_events.sql`` alone); ``off`` disables the triggers on
``orders``: the flush of the code before the outbox, to measure what the
events cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import asyncpg
import orjson
import uvloop

from gateway.domain.model import Outcome, Purchase, Result
from gateway.domain.skus import IfMissing
from gateway.domain.stock import ReplyKind, Settlement, StockLoad
from gateway.lock import LockStats, LockSubscriber, load_lock_scripts
from gateway.postgres.database import create_pool
from gateway.postgres.inventory import Inventory
from gateway.postgres.orders import BatchDecision, Orders
from gateway.redis.connections import RedisClient, create_redis
from gateway.redis.reservations import Reservations
from gateway.server import GC_THRESHOLDS
from gateway.settings import LockFamily, Settings
from gateway.write.flusher import Flusher
from gateway.write.sku_locks import FlushLock, SkuLocks, sku_locks
from loadtests.lib import machine, pinning
from loadtests.lib.cputime import run_and_queued
from loadtests.lib.flush_report import (
    MODES,
    Drain,
    best,
    schedule,
    split_table,
    summarize,
    throughput_table,
)
from loadtests.lib.harness import Harness
from loadtests.lib.options import PG_URL, REDIS_URL, RESULTS_DIR
from loadtests.lib.signals import signals_interrupt

BATCHES = (32, 64, 128, 256, 512)
# Reservations per reserve.lua call while stocking a drain (one call per loop turn).
RESERVE_CHUNK = 512
# Round trips timed for the table's header.
PINGS = 200
TARGET_PER_S = 25_000


Part = Literal["lock_s", "sql_s", "settle_s"]


@dataclass(slots=True)
class Splits:
    """Seconds spent so far in the flush lock, the SQL and the settle."""

    lock_s: float = 0.0
    sql_s: float = 0.0
    settle_s: float = 0.0

    @contextlib.contextmanager
    def timing(self, part: Part) -> Iterator[None]:
        """Add the seconds the block takes to ``part``, whatever it raises."""
        started = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, part, getattr(self, part) + time.perf_counter() - started)


class TimedOrders(Orders):
    """The gateway's Orders, timing ``commit_batch`` (the ``flush_batch()`` call)."""

    def __init__(self, pool: asyncpg.Pool[Any], splits: Splits) -> None:
        super().__init__(pool)
        self._splits = splits

    async def commit_batch(
        self, sku: str, batch: Sequence[Purchase], fence: int | None, handoff: str | None = None
    ) -> BatchDecision:
        with self._splits.timing("sql_s"):
            return await super().commit_batch(sku, batch, fence, handoff)


class TimedReservations(Reservations):
    """The gateway's Reservations, timing ``settle`` (``settle.lua``)."""

    def __init__(self, redis: RedisClient, settings: Settings, splits: Splits) -> None:
        super().__init__(redis, settings)
        self._splits = splits

    async def settle(
        self, sku: str, settlements: Iterable[Settlement], db_stock_after: int | None
    ) -> int:
        with self._splits.timing("settle_s"):
            return await super().settle(sku, settlements, db_stock_after)


class TimedLock:
    """A sku's flush lock, timing its acquisitions and releases."""

    def __init__(self, lock: FlushLock, splits: Splits) -> None:
        self._lock = lock
        self._splits = splits

    @property
    def fence(self) -> int:
        return self._lock.fence

    @property
    def lost(self) -> asyncio.Event:
        return self._lock.lost

    async def acquire(self, wait: float | None = None) -> bool:
        with self._splits.timing("lock_s"):
            return await self._lock.acquire(wait)

    async def release(self) -> None:
        with self._splits.timing("lock_s"):
            await self._lock.release()

    def abandon(self) -> None:
        self._lock.abandon()

    def __call__(self, wait: float | None = None) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._lock(wait)


@dataclass
class Rig:
    """The gateway's flush path, wired as the gateway wires it, with timers."""

    redis: RedisClient
    pool: asyncpg.Pool[Any]
    orders: Orders
    reservations: Reservations
    subscriber: LockSubscriber
    # The Flusher with the Redis flush lock, and the one without any.
    locked: Flusher
    lockless: Flusher
    splits: Splits

    @classmethod
    async def open(cls, database_url: str, redis_url: str, key_prefix: str) -> Rig:
        """Connect and wire; the scripts loaded."""
        settings = Settings(database_url=database_url, redis_url=redis_url, key_prefix=key_prefix)
        splits = Splits()
        redis = create_redis(settings)
        pool = await create_pool(settings)
        orders = TimedOrders(pool, splits)
        reservations = TimedReservations(redis, settings, splits)
        await reservations.load_scripts()
        await load_lock_scripts(redis)
        subscriber = LockSubscriber(redis)
        real = sku_locks(settings, redis, pool, subscriber, LockStats())

        def timed(sku: str) -> FlushLock:
            lock = real.get(sku)
            assert lock is not None, "GATEWAY_FLUSH_LOCK=redis makes a lock per sku"
            return TimedLock(lock, splits)

        locks = SkuLocks(real.family, real.wait_s, timed)
        unlocked = SkuLocks(LockFamily.NONE, real.wait_s, None)
        return cls(
            redis=redis,
            pool=pool,
            orders=orders,
            reservations=reservations,
            subscriber=subscriber,
            locked=Flusher(reservations=reservations, orders=orders, locks=locks),
            lockless=Flusher(reservations=reservations, orders=orders, locks=unlocked),
            splits=splits,
        )

    async def close(self) -> None:
        """Close the subscriber, the pool and the client."""
        await self.subscriber.aclose()
        await self.pool.close()
        await self.redis.aclose()


async def stock_up(rig: Rig, sku: str, count: int) -> list[Purchase]:
    """Create ``sku`` with ``count`` units and reserve them all in Redis, a new
    buyer each, as the gateway's purchases do; the reserved purchases."""
    inventory = Inventory(rig.pool)
    await inventory.change_sku(sku, {"stock": count}, if_missing=IfMissing.CREATE)
    await rig.reservations.load_stock(sku, count, StockLoad.FRESH)
    info = await inventory.sku_info(sku)
    assert info is not None
    wanted = [Purchase(sku, f"u{i}", 1, uuid.uuid4().hex) for i in range(count)]
    reserved: list[Purchase] = []
    for start in range(0, count, RESERVE_CHUNK):
        chunk = wanted[start : start + RESERVE_CHUNK]
        replies = await asyncio.gather(*(rig.reservations.reserve(p, info) for p in chunk))
        for purchase, reply in zip(chunk, replies, strict=True):
            if reply.kind is not ReplyKind.OK:
                raise RuntimeError(f"reserve {purchase.request_id}: {reply.kind}")
            reserved.append(
                Purchase(sku, purchase.user_id, 1, purchase.request_id, reply.reserved_at_ms)
            )
    return reserved


async def drain(rig: Rig, mode: str, batch: int, round_: int, batches: int) -> Drain:
    """Reserve ``batch * batches`` purchases of a new sku, then flush them in batches
    of ``batch`` back to back, the lock taken as ``mode`` says; checked and timed."""
    sku = f"{mode}-{batch}-{round_}-{uuid.uuid4().hex[:6]}"
    purchases = await stock_up(rig, sku, batch * batches)
    flusher = rig.lockless if mode == "none" else rig.locked
    chunks = [purchases[i : i + batch] for i in range(0, len(purchases), batch)]
    watched = await _Watched.find(rig)
    before, splits = watched.usage(), replace(rig.splits)
    answers: list[Result | BaseException] = []
    started = time.perf_counter()
    for chunk in chunks:
        answers += await flusher.flush(sku, chunk)
        if mode == "per-batch":
            await flusher.emptied(sku)
    # The slice's last hold ends with the drain.
    await flusher.emptied(sku)
    wall = time.perf_counter() - started
    after = watched.usage()
    await _check(rig, sku, answers, len(purchases))
    return Drain(
        mode=mode,
        batch=batch,
        round=round_,
        batches=batches,
        wall_s=wall,
        lock_s=rig.splits.lock_s - splits.lock_s,
        sql_s=rig.splits.sql_s - splits.sql_s,
        settle_s=rig.splits.settle_s - splits.settle_s,
        cpu_s=after.cpu_s - before.cpu_s,
        queued_s=after.queued_s - before.queued_s,
        pg_cpu_s=_minus(after.pg_cpu_s, before.pg_cpu_s),
        redis_cpu_s=_minus(after.redis_cpu_s, before.redis_cpu_s),
    )


async def _check(rig: Rig, sku: str, answers: list[Result | BaseException], count: int) -> None:
    """Raise unless every purchase was confirmed, the ledger is empty and the
    database sold the whole stock: a drain that failed measures nothing."""
    refused = [
        a for a in answers if not isinstance(a, Result) or a.outcome is not Outcome.CONFIRMED
    ]
    if refused or len(answers) != count:
        raise RuntimeError(f"{sku}: {len(refused)} of {len(answers)} not confirmed: {refused[:3]}")
    pending = await rig.reservations.pending(sku)
    sold, stock = await rig.orders.units_sold(sku), await rig.orders.stock(sku)
    if pending or sold != count or stock != 0:
        raise RuntimeError(f"{sku}: {len(pending)} pending, {sold} sold, stock {stock}")


@dataclass(frozen=True, slots=True)
class _Usage:
    """CPU seconds so far of this process, the database's backends and Redis, and
    this process's seconds waiting for a core."""

    cpu_s: float
    queued_s: float
    pg_cpu_s: float | None
    redis_cpu_s: float | None


@dataclass(frozen=True, slots=True)
class _Watched:
    """The processes whose CPU a drain counts: the database's backends, and the
    Redis server, when they run on this machine (empty, None: not readable)."""

    backends: tuple[int, ...]
    redis_pid: int | None

    @classmethod
    async def find(cls, rig: Rig) -> _Watched:
        rows = await rig.pool.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        )
        backends = tuple(r["pid"] for r in rows if _named(r["pid"], "postgres"))
        info = await rig.redis.info("server")
        pid = int(info["process_id"])
        return cls(backends, pid if _named(pid, "redis-server") else None)

    def placement(self) -> str:
        """The cores the servers may run on, for the results."""
        cores = {"PostgreSQL": _cores(self.backends[:1]), "Redis": _cores((self.redis_pid,))}
        return ", ".join(f"{name} on cores {where}" for name, where in cores.items())

    def usage(self) -> _Usage:
        own = run_and_queued(os.getpid())
        assert own is not None, "this process reads its own schedstat"
        pg = [run_and_queued(pid) for pid in self.backends]
        redis = None if self.redis_pid is None else run_and_queued(self.redis_pid)
        return _Usage(
            cpu_s=own[0],
            queued_s=own[1],
            pg_cpu_s=sum(p[0] for p in pg if p) if pg and all(pg) else None,
            redis_cpu_s=None if redis is None else redis[0],
        )


def _named(pid: int, name: str) -> bool:
    """Whether ``pid`` is a local process called ``name`` (a server on another host
    has pids that mean nothing here)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == name
    except OSError:
        return False


def _cores(pids: Sequence[int | None]) -> str:
    """The cores the first of ``pids`` may run on, or "unknown" (not on this machine)."""
    if not pids or pids[0] is None:
        return "unknown"
    return ",".join(str(core) for core in sorted(os.sched_getaffinity(pids[0])))


def _minus(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


async def round_trips(rig: Rig) -> dict[str, float]:
    """Median milliseconds of a pooled ``SELECT 1`` and of a Redis PING: what a
    round trip costs here, apart from any work."""
    found: dict[str, list[float]] = {"postgres_ms": [], "redis_ms": []}
    for _ in range(PINGS):
        started = time.perf_counter()
        await rig.pool.fetchval("SELECT 1")
        found["postgres_ms"].append(time.perf_counter() - started)
        started = time.perf_counter()
        await rig.redis.ping()
        found["redis_ms"].append(time.perf_counter() - started)
    return {name: statistics.median(times) * 1000 for name, times in found.items()}


async def measure(
    database_url: str, redis_url: str, key_prefix: str, config: argparse.Namespace
) -> dict[str, Any]:
    """Warm up, run the rounds; the raw drains and the round trips."""
    rig = await Rig.open(database_url, redis_url, key_prefix)
    try:
        await rig.pool.execute(OUTBOX[config.outbox])
        for mode, size in schedule(0, 1, config.modes, config.batches):
            await drain(rig, mode, size, -1, 1)
        trips = await round_trips(rig)
        servers = (await _Watched.find(rig)).placement()
        gc.collect()
        gc.freeze()
        drains = []
        for round_ in range(config.rounds):
            for mode, size in schedule(round_, config.rounds, config.modes, config.batches):
                drains.append(await drain(rig, mode, size, round_, max(1, config.orders // size)))
        return {"round_trips": trips, "servers": servers, "drains": drains}
    finally:
        await rig.close()


# What --outbox does to the bench's database before the first drain.
OUTBOX = {
    "on": "INSERT INTO event_sinks (name) VALUES ('stream') ON CONFLICT DO NOTHING",
    "events": "ALTER TABLE order_events DISABLE TRIGGER order_events_owed",
    "off": "ALTER TABLE orders DISABLE TRIGGER orders_inserted, DISABLE TRIGGER orders_changed,"
    " DISABLE TRIGGER orders_version",
}


def report(results: dict[str, Any]) -> str:
    """The tables and what they say against the target, as Markdown."""
    rows = results["summary"]
    lines = [
        f"orders/s of one sku's flush path, median (min-max) of {results['config']['rounds']}"
        f" interleaved rounds; {results['pinning']}",
        f"round trips: PostgreSQL {results['round_trips']['postgres_ms']:.3f} ms,"
        f" Redis {results['round_trips']['redis_ms']:.3f} ms;"
        f" load average {_load(results['load_average']['before'])} before,"
        f" {_load(results['load_average']['after'])} after",
        "",
        throughput_table(rows),
        "",
        split_table(rows),
        "",
    ]
    for mode in MODES:
        top = best(rows, mode)
        if top is not None:
            verdict = "meets" if top.per_s >= TARGET_PER_S else "misses"
            lines.append(
                f"{mode}: best at batch {top.batch}, {top.per_s:,.0f} orders/s:"
                f" {verdict} the {TARGET_PER_S:,} target"
            )
    return "\n".join(lines)


def _load(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.bench_flush",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--batches", type=_ints, default=BATCHES, help="batch sizes, comma-separated"
    )
    parser.add_argument(
        "--orders",
        type=int,
        default=4096,
        help="orders a drain commits (whole batches, at least one)",
    )
    parser.add_argument("--modes", type=_modes, default=MODES, help="lock modes, comma-separated")
    parser.add_argument("--pg-url", default=PG_URL, help="the server to create its database on")
    parser.add_argument("--redis-url", default=REDIS_URL)
    parser.add_argument("--no-pin", action="store_true", help="leave this process unpinned")
    parser.add_argument(
        "--outbox", choices=sorted(OUTBOX), default="on", help="the order events' triggers"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "flush.json")
    return parser.parse_args(argv)


def _ints(raw: str) -> tuple[int, ...]:
    return tuple(int(part) for part in raw.split(","))


def _modes(raw: str) -> tuple[str, ...]:
    modes = tuple(part.strip() for part in raw.split(","))
    unknown = set(modes) - set(MODES)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown modes {sorted(unknown)}; known: {MODES}")
    return modes


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m loadtests.bench_flush``."""
    config = parse(argv)
    # Described before pinning, which leaves this process one core to see.
    described = machine.describe()
    placed = pinning.choose(not config.no_pin)
    placed.join_servers()
    where = "unpinned" if placed.servers is None else f"this process on core {placed.servers}"
    gc.set_threshold(*GC_THRESHOLDS)
    load_before = machine.load_average()
    try:
        with (
            signals_interrupt(),
            Harness(pg_url=config.pg_url, redis_url=config.redis_url) as harness,
        ):
            url = harness.database("flush")
            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
            with runner:
                found = runner.run(
                    measure(url, harness.redis_url, f"{harness.key_prefix}:flush", config)
                )
    except KeyboardInterrupt:
        print("bench_flush: interrupted; its database and keys were removed", file=sys.stderr)
        return 130
    except (RuntimeError, OSError) as exc:
        print(f"bench_flush: {exc}", file=sys.stderr)
        return 1
    drains: list[Drain] = found["drains"]
    results: dict[str, Any] = {
        "command": "python -m loadtests.bench_flush",
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {
            "rounds": config.rounds,
            "batches": list(config.batches),
            "orders": config.orders,
            "modes": list(config.modes),
            "outbox": config.outbox,
        },
        "machine": described,
        "pinning": f"{where}; PostgreSQL and Redis shared, {found['servers']}",
        "load_average": {"before": load_before, "after": machine.load_average()},
        "round_trips": found["round_trips"],
        "summary": summarize(drains),
        "drains": drains,
    }
    print(report(results))
    config.out.parent.mkdir(parents=True, exist_ok=True)
    config.out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"wrote {config.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
