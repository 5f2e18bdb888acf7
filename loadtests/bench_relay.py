"""The relay's throughput: order events a second from the outbox to a sink.

    python -m loadtests.bench_relay [--events 20000] [--rounds 3]
        [--batches 64,256,1024] [--relays 1,2] [--no-pin] [--out PATH]
        [--pg-url URL] [--redis-url URL]

The gateway's own :class:`~gateway.usecases.relay.Relay` and
:class:`~gateway.redis.event_stream.EventStream`, in this process (uvloop, on
the servers' core, ``loadtests.lib.pinning``), on a database and a stream key
of its own, both removed at the end. Each drain writes ``--events`` events to
the outbox untimed (one INSERT; its trigger owes each to the ``stream`` sink),
then runs R relays side by side, each claiming batches of B, pass after pass
until none claims anything, timed from the first claim to the last settle. It
checks that the outbox owes nothing and the stream holds every event once.
Every (relays, batch size) is one drain per round, ``--rounds`` rounds, the
order shifted each round. It prints a Markdown table and writes
``loadtests/results/relay.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import uvloop
from redis.asyncio import Redis

from gateway.postgres.database import migrate
from gateway.postgres.outbox import Outbox
from gateway.redis.event_stream import EventStream
from gateway.usecases.relay import Relay
from loadtests.lib.machine import describe, load_average
from loadtests.lib.options import PG_URL, REDIS_URL, RESULTS_DIR
from loadtests.lib.pinning import choose
from testkit.services import create_database, drop_database

WRITE = """
INSERT INTO order_events (order_id, version, type, request_id, sku, user_id, qty, status)
SELECT gen_random_uuid(), 1, 'order.confirmed', 'bench.' || n, 'bench', 'u' || n, 1, 'confirmed'
FROM generate_series(1, $1) n
"""
CLEAR = "TRUNCATE order_events, event_deliveries"


class Quiet:
    """The relay's observer: nothing to report here."""

    def delivered(self, sink: str, lags_s: Sequence[float]) -> None:
        """Not measured."""

    def failed(self, sink: str, count: int) -> None:
        """A bench drain fails on any refusal (see :func:`drain`)."""
        raise RuntimeError(f"{count} events refused by {sink}")

    def sample(self, stats: object) -> None:
        """Not measured."""


async def drain(
    pool: asyncpg.Pool, redis: Redis, key: str, events: int, relays: int, batch: int
) -> float:
    """One drain; its events a second."""
    await pool.execute(CLEAR)
    await redis.delete(key)
    await pool.execute(WRITE, events)
    stream = EventStream(redis, key, max_len=0, max_age_s=86_400.0, webhook_owed=None)
    workers = [
        Relay(outbox=Outbox(pool), sinks=[stream], observer=Quiet(), batch=batch, poll_s=0.01)
        for _ in range(relays)
    ]

    async def loop(relay: Relay) -> None:
        while await relay.relay_once(stream):
            pass

    started = time.perf_counter()
    await asyncio.gather(*(loop(r) for r in workers))
    elapsed = time.perf_counter() - started
    owed = await pool.fetchval("SELECT count(*) FROM event_deliveries")
    appended = await redis.xlen(key)
    if owed or appended != events:
        raise RuntimeError(f"drain left {owed} owed, {appended} of {events} on the stream")
    return events / elapsed


async def measure(config: argparse.Namespace) -> dict[str, Any]:
    """Every drain of every round, on a database and a stream of the run's own."""
    name = f"flashsale_bench_relay_{uuid.uuid4().hex[:8]}"
    url = await create_database(name, config.pg_url)
    redis = Redis.from_url(config.redis_url)
    key = f"fsbench-relay-{uuid.uuid4().hex[:8]}:events"
    try:
        con = await asyncpg.connect(url)
        await migrate(con)
        await con.execute("INSERT INTO event_sinks (name) VALUES ('stream')")
        await con.close()
        pool = await asyncpg.create_pool(url, min_size=2, max_size=8)
        assert pool is not None
        cells = [(r, b) for r in config.relays for b in config.batches]
        drains: list[dict[str, Any]] = []
        try:
            for round_ in range(config.rounds):
                shift = round_ % len(cells)
                for relays, batch in cells[shift:] + cells[:shift]:
                    rate = await drain(pool, redis, key, config.events, relays, batch)
                    drains.append({"round": round_, "relays": relays, "batch": batch, "rate": rate})
        finally:
            await pool.close()
    finally:
        await redis.delete(key)
        await redis.aclose()
        await drop_database(name, config.pg_url)
    return {"drains": drains, "summary": summary(drains)}


def summary(drains: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (relays, batch): the median, min and max events/s of the rounds."""
    cells: dict[tuple[int, int], list[float]] = {}
    for d in drains:
        cells.setdefault((d["relays"], d["batch"]), []).append(d["rate"])
    return [
        {"relays": r, "batch": b, "median": statistics.median(v), "min": min(v), "max": max(v)}
        for (r, b), v in sorted(cells.items())
    ]


def report(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of the summary."""
    lines = ["| relays | batch | events/s median (min-max) |", "|--:|--:|--:|"]
    for row in rows:
        lines.append(
            f"| {row['relays']} | {row['batch']} | {row['median']:,.0f}"
            f" ({row['min']:,.0f}-{row['max']:,.0f}) |"
        )
    return "\n".join(lines)


def _ints(raw: str) -> list[int]:
    return [int(part) for part in raw.split(",") if part.strip()]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The bench's options."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.bench_relay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=_ints, default=[64, 256, 1024])
    parser.add_argument("--relays", type=_ints, default=[1, 2], help="relays side by side")
    parser.add_argument("--no-pin", action="store_true", help="leave the bench unpinned")
    parser.add_argument("--pg-url", default=PG_URL, help="the server to create its database on")
    parser.add_argument("--redis-url", default=REDIS_URL)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "relay.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; 0, or 1 when a drain's check failed."""
    config = parse(argv)
    pinning = choose(not config.no_pin)
    pinning.join_servers()
    before = load_average()
    try:
        results = uvloop.run(measure(config))
    except RuntimeError as exc:
        print(f"bench_relay: {exc}", file=sys.stderr)
        return 1
    results.update(
        machine=describe(),
        pinning=pinning.describe(),
        load_before=before,
        load_after=load_average(),
        events=config.events,
        rounds=config.rounds,
    )
    config.out.parent.mkdir(parents=True, exist_ok=True)
    config.out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(report(results["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
