"""The relay's throughput: order events a second from the outbox to a sink.

    python -m loadtests.bench_relay [--events 10000] [--slow-events 2000]
        [--rounds 3] [--sinks stream,webhook,webhook-50ms] [--batches 256]
        [--relays 1,2] [--no-pin] [--out PATH] [--pg-url URL] [--redis-url URL]
        [--stream-replicas N]

The gateway's own :class:`~gateway.usecases.relay.Relay` with its sinks, in
this process (uvloop, on the servers' core, ``loadtests.lib.pinning``), on a
database and a stream key of its own, both removed at the end. The sinks:
``stream``, :class:`~gateway.redis.event_stream.EventStream`; ``webhook``,
the :class:`~gateway.outbound.WebhookSink` POSTing to a loopback receiver
that answers at once; ``webhook-50ms``, to one that answers after 50 ms
(``loadtests.lib.webhook_target``, a process of its own on the load
generator's core; ``--slow-events`` events: at most 64 POSTs in flight make
it slow by design). Each drain writes the events to the outbox untimed (an
INSERT per 100, as flushes write them; its trigger owes them to the one sink
registered), then runs R relays side by side, each claiming batches of B, pass after pass until none
claims anything, timed from the first claim to the last settle. It checks
that the outbox owes nothing, and that the stream holds every event once.
Every (sink, relays, batch size) is one drain per round, ``--rounds``
rounds, the order shifted each round. Besides the events a second it takes
this process's CPU over each drain, an event: what the relay costs the
gateway, its metrics included; and, for the stream on a Redis of this
machine, that Redis's CPU an event (``loadtests.lib.proc_cpu``: everything
the server did meanwhile, so give it a Redis of its own, ``--redis-url``, on a
shared machine). PostgreSQL's share is not in it.
It prints a Markdown table and writes ``loadtests/results/relay.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import uvloop
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from gateway.domain.events import EventSink
from gateway.ops.event_metrics import EventMetrics
from gateway.outbound import WebhookSink
from gateway.postgres.database import migrate
from gateway.postgres.outbox import Outbox
from gateway.redis.event_stream import EventStream
from gateway.settings import Settings
from gateway.usecases.relay import Relay
from loadtests.lib.machine import describe, load_average
from loadtests.lib.options import PG_URL, REDIS_URL, REPO_ROOT, RESULTS_DIR
from loadtests.lib.pinning import Pinning, choose
from loadtests.lib.proc_cpu import local_pid, snapshot
from loadtests.lib.targets import Target, wait_ready
from testkit.ports import free_port
from testkit.processes import die_with_parent, stop_process
from testkit.services import create_database, drop_database

# $2 events from the $1-th: one statement, as one flush writes its batch's.
WRITE = """
INSERT INTO order_events (order_id, version, type, request_id, sku, user_id, qty, status)
SELECT gen_random_uuid(), 1, 'order.confirmed', 'bench.' || n, 'bench', 'u' || n, 1, 'confirmed'
FROM generate_series($1::int, $1::int + $2::int - 1) n
"""
# Events a flush writes at once: its batch (GATEWAY_BATCH_MAX is 256; a sale
# in stock flushes smaller ones).
FLUSH_EVENTS = 100
CLEAR = "TRUNCATE order_events, event_deliveries, event_batches, event_sinks"
REGISTER = "INSERT INTO event_sinks (name) VALUES ($1)"
SECRET = "bench-webhook-secret"
# The webhook sinks' receivers: how long each takes to answer, in ms.
RECEIVERS = {"webhook": 0.0, "webhook-50ms": 50.0}
SINKS = ("stream", *RECEIVERS)


class Metered(EventMetrics):
    """The gateway's own metrics of the relay (their cost is the gateway's),
    and a bench drain fails on any refusal."""

    def __init__(self) -> None:
        super().__init__(CollectorRegistry())

    def failed(self, sink: str, count: int) -> None:
        raise RuntimeError(f"{count} events refused by {sink}")


async def drain(
    pool: asyncpg.Pool, sink: EventSink, events: int, relays: int, batch: int, redis: int | None
) -> tuple[float, float, float | None]:
    """One drain of ``events`` to ``sink`` by ``relays`` relays: its events a
    second, this process's CPU an event in µs (the relay's share of the core:
    the gateway's, without PostgreSQL's and Redis's), and that of the Redis
    whose pid is ``redis`` (None: not measured)."""
    await pool.execute(CLEAR)
    await pool.execute(REGISTER, sink.name)
    for first in range(0, events, FLUSH_EVENTS):
        await pool.execute(WRITE, first, min(FLUSH_EVENTS, events - first))
    workers = [
        Relay(outbox=Outbox(pool), sinks=[sink], observer=Metered(), batch=batch, poll_s=0.01)
        for _ in range(relays)
    ]

    async def loop(relay: Relay) -> None:
        while await relay.relay_once(sink):
            pass

    server = snapshot(redis) if redis is not None else None
    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(loop(r) for r in workers))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    served = None if server is None or redis is None else snapshot(redis).total() - server.total()
    owed = await pool.fetchval("SELECT count(*) FROM events_owed")
    if owed:
        raise RuntimeError(f"a drain to {sink.name} left {owed} events owed")
    return events / elapsed, cpu / events * 1e6, None if served is None else served / events * 1e6


@contextlib.asynccontextmanager
async def opened(
    name: str, redis: Redis, key: str, url: str | None, replicas: int
) -> AsyncIterator[EventSink]:
    """The sink a cell drains to: the stream (each batch waiting for
    ``replicas``), or a webhook POSTing to ``url``."""
    if url is None:
        yield EventStream(
            redis, key, max_len=0, max_age_s=86_400.0, webhook_owed=None, replicas=replicas
        )
        return
    webhook = WebhookSink(Settings(webhook_url=url, webhook_secret=SECRET), lambda _: None)
    try:
        yield webhook
    finally:
        await webhook.close()


async def measure(config: argparse.Namespace, urls: dict[str, str]) -> dict[str, Any]:
    """Every drain of every round, on a database and a stream of the run's own."""
    name = f"flashsale_bench_relay_{uuid.uuid4().hex[:8]}"
    url = await create_database(name, config.pg_url)
    redis = Redis.from_url(config.redis_url)
    key = f"fsbench-relay-{uuid.uuid4().hex[:8]}:events"
    try:
        con = await asyncpg.connect(url)
        await migrate(con)
        await con.close()
        pool = await asyncpg.create_pool(url, min_size=2, max_size=8)
        assert pool is not None
        try:
            return {"drains": await rounds(config, pool, redis, key, urls)}
        finally:
            await pool.close()
    finally:
        await redis.delete(key)
        await redis.aclose()
        await drop_database(name, config.pg_url)


async def rounds(
    config: argparse.Namespace, pool: asyncpg.Pool, redis: Redis, key: str, urls: dict[str, str]
) -> list[dict[str, Any]]:
    """The rounds of drains, each round's order shifted by one cell."""
    cells = [(s, r, b) for s in config.sinks for r in config.relays for b in config.batches]
    server = local_pid(int((await redis.info("server"))["process_id"]))
    drains: list[dict[str, Any]] = []
    for round_ in range(config.rounds):
        shift = round_ % len(cells)
        for name, relays, batch in cells[shift:] + cells[:shift]:
            events = config.slow_events if name == "webhook-50ms" else config.events
            async with opened(name, redis, key, urls.get(name), config.stream_replicas) as sink:
                measured = server if name == "stream" else None
                rate, cpu_us, redis_us = await drain(pool, sink, events, relays, batch, measured)
            if name == "stream" and await redis.xlen(key) != events:
                raise RuntimeError("the stream does not hold every event once")
            await redis.delete(key)
            cell = {"sink": name, "relays": relays, "batch": batch, "events": events}
            drains.append(
                {"round": round_, **cell, "rate": rate, "relay_cpu_us": cpu_us}
                | {"redis_cpu_us": redis_us}
            )
    return drains


@contextlib.contextmanager
def receivers(names: Sequence[str], pinning: Pinning, logs: Path) -> Iterator[dict[str, str]]:
    """A receiver process per webhook sink asked for, on the load generator's
    core; their URLs by sink name."""
    targets: list[Target] = []
    try:
        for name in (n for n in names if n in RECEIVERS):
            port, log = free_port(), logs / f"{name}.log"
            command = [sys.executable, "-m", "loadtests.lib.webhook_target", f"--port={port}"]
            command.append(f"--delay-ms={RECEIVERS[name]}")
            with log.open("wb") as out:
                process = subprocess.Popen(
                    pinning.load_command(command),
                    cwd=REPO_ROOT,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=die_with_parent(),
                )
            targets.append(Target(name, port, process, log))
            wait_ready(targets[-1])
        yield {t.name: f"{t.url}/hook" for t in targets}
    finally:
        for target in targets:
            stop_process(target.process)


def summary(drains: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (sink, relays, batch): the median, min and max events/s of the rounds,
    and the medians of the relay's and Redis's CPU an event."""
    cells: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for d in drains:
        cells.setdefault((d["sink"], d["relays"], d["batch"]), []).append(d)
    rows = []
    for (s, r, b), found in sorted(cells.items(), key=lambda c: (SINKS.index(c[0][0]), c[0][1:])):
        rates = [d["rate"] for d in found]
        rows.append(
            {"sink": s, "relays": r, "batch": b}
            | {"median": statistics.median(rates), "min": min(rates), "max": max(rates)}
            | {"relay_cpu_us": statistics.median(d["relay_cpu_us"] for d in found)}
            | {"redis_cpu_us": _median(d["redis_cpu_us"] for d in found)}
        )
    return rows


def report(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of the summary."""
    lines = [
        "| sink | relays | batch | events/s median (min-max) | relay CPU µs/event"
        " | Redis CPU µs/event |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        redis = "-" if row["redis_cpu_us"] is None else f"{row['redis_cpu_us']:.1f}"
        lines.append(
            f"| {row['sink']} | {row['relays']} | {row['batch']} | {row['median']:,.0f}"
            f" ({row['min']:,.0f}-{row['max']:,.0f}) | {row['relay_cpu_us']:.1f} | {redis} |"
        )
    return "\n".join(lines)


def _median(values: Iterable[float | None]) -> float | None:
    """The median of the measured values; None when none was."""
    measured = [v for v in values if v is not None]
    return statistics.median(measured) if measured else None


def _ints(raw: str) -> list[int]:
    return [int(part) for part in raw.split(",") if part.strip()]


def _sinks(raw: str) -> list[str]:
    names = [part.strip() for part in raw.split(",") if part.strip()]
    unknown = set(names) - set(SINKS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown sinks {sorted(unknown)}; known: {SINKS}")
    return names


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The bench's options."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.bench_relay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument(
        "--slow-events", type=int, default=2_000, help="events of a webhook-50ms drain"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sinks", type=_sinks, default=list(SINKS))
    parser.add_argument("--batches", type=_ints, default=[256])
    parser.add_argument("--relays", type=_ints, default=[1, 2], help="relays side by side")
    parser.add_argument("--no-pin", action="store_true", help="leave the bench unpinned")
    parser.add_argument("--pg-url", default=PG_URL, help="the server to create its database on")
    parser.add_argument("--redis-url", default=REDIS_URL)
    parser.add_argument(
        "--stream-replicas",
        type=int,
        default=0,
        help="replicas each stream batch waits for (WAIT; the Redis needs them)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "relay.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; 0, or 1 when a drain's check failed."""
    config = parse(argv)
    pinning = choose(not config.no_pin)
    before = load_average()
    try:
        with (
            tempfile.TemporaryDirectory(prefix="bench-relay-") as logs,
            receivers(config.sinks, pinning, Path(logs)) as urls,
        ):
            pinning.join_servers()
            drains = uvloop.run(measure(config, urls))["drains"]
    except RuntimeError as exc:
        print(f"bench_relay: {exc}", file=sys.stderr)
        return 1
    results = {
        "command": "python -m loadtests.bench_relay",
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {k: v for k, v in vars(config).items() if k not in ("out",)} | {"out": None},
        "machine": describe(),
        "pinning": pinning.describe(),
        "load_average": {"before": before, "after": load_average()},
        "drains": drains,
        "summary": summary(drains),
    }
    config.out.parent.mkdir(parents=True, exist_ok=True)
    config.out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(report(results["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
