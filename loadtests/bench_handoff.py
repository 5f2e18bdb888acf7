"""The hand-off's own cost: a flush's first events appended to the stream, an event.

    python -m loadtests.bench_handoff [--sizes 10,30,90,300] [--passes 1000]
        [--rounds 3] [--no-pin] [--redis-url URL] [--out PATH]

The gateway's own :meth:`~gateway.redis.event_stream.EventStream.hand_off`
appends passes of N first events (one flush of N new orders a pass, as
``flush_batch()`` gives them), pass after pass, to a stream key of its own
(removed at the end), in this process (uvloop, on the servers' core,
``loadtests.lib.pinning``). Per pass size, each round: this process's CPU
(``time.process_time``) and, on a Redis of this machine, that Redis's
(``loadtests.lib.proc_cpu``: everything the server did meanwhile, so give it a
Redis of its own, ``--redis-url``, on a shared machine), an event, then a
straight line over the sizes (least squares on the medians): what a pass costs
and what an event costs, each side.

The stack bench (``loadtests.bench_stack``) measures what the events cost a
sale, on one core shared with everything else, where a pair of rounds moves
by 15 % of the stack's CPU; this measures the appends alone, to a few
percent. Not in it: PostgreSQL's part (the flush's batch row and its record)
and the loop's pace (``gateway.usecases.handoff``). It prints a Markdown
table and writes ``loadtests/results/handoff.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import uvloop
from redis.asyncio import Redis

from gateway.domain.events import FirstEvents
from gateway.domain.model import Order
from gateway.redis.event_stream import EventStream
from loadtests.lib.machine import describe, load_average
from loadtests.lib.options import REDIS_URL, RESULTS_DIR
from loadtests.lib.pinning import choose
from loadtests.lib.proc_cpu import local_pid, snapshot

# Passes before the measured ones of a size: connections made, caches warm.
WARMUP_PASSES = 50
# Distinct flushes a size's passes take in turn (a flush appended again is new
# entries all the same): a run holds these, not a flush a pass.
FLUSHES = 32


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The bench's options."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.bench_handoff",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        type=lambda raw: [int(n) for n in raw.split(",")],
        default=[10, 30, 90, 300],
        help="first events a pass (flush sizes), comma-separated",
    )
    parser.add_argument("--passes", type=int, default=1000, help="measured passes a size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--redis-url", default=REDIS_URL)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "handoff.json")
    config = parser.parse_args(argv)
    if min(config.sizes) < 1 or config.passes < 1 or config.rounds < 1:
        parser.error("sizes, passes and rounds must be at least 1")
    return config


def flush(token: int, size: int) -> FirstEvents:
    """A flush of ``size`` new orders, ids as a sale makes them."""
    orders = [
        Order(
            str(uuid.uuid4()),
            f"req-{uuid.uuid4().hex}",
            "bench-handoff",
            f"u{uuid.uuid4().hex[:12]}",
            1,
        )
        for _ in range(size)
    ]
    return FirstEvents(token, "2026-12-07T12:00:00.000Z", orders)


async def one_size(
    stream: EventStream, redis_pid: int | None, size: int, passes: int
) -> dict[str, Any]:
    """``passes`` passes of ``size`` events: this process's and Redis's CPU an event."""
    flushes = [flush(i, size) for i in range(FLUSHES)]
    for i in range(WARMUP_PASSES):
        await stream.hand_off([flushes[i % FLUSHES]])
    server = snapshot(redis_pid) if redis_pid is not None else None
    cpu = time.process_time()
    for i in range(passes):
        if not all(await stream.hand_off([flushes[i % FLUSHES]])):
            raise RuntimeError(f"a pass of {size} was refused")
    cpu = time.process_time() - cpu
    events = size * passes
    served = (
        None
        if server is None or redis_pid is None
        else snapshot(redis_pid).total() - server.total()
    )
    return {
        "size": size,
        "gateway_us": cpu / events * 1e6,
        "redis_us": None if served is None else served / events * 1e6,
    }


async def measure(config: argparse.Namespace) -> list[dict[str, Any]]:
    """Every size in every round (the order turned each round), on a key of the run's own."""
    redis = Redis.from_url(config.redis_url)
    key = f"fsbench-handoff-{uuid.uuid4().hex[:8]}:events"
    cells: list[dict[str, Any]] = []
    try:
        redis_pid = local_pid(int((await redis.info("server"))["process_id"]))
        # Trimmed by age, as by default, counted back a day: nothing goes in a run.
        stream = EventStream(redis, key, max_len=0, max_age_s=86_400.0, webhook_owed=None)
        sizes = list(config.sizes)
        for round_ in range(config.rounds):
            turned = sizes[round_ % len(sizes) :] + sizes[: round_ % len(sizes)]
            for size in turned:
                cell = await one_size(stream, redis_pid, size, config.passes)
                cells.append({"round": round_, **cell})
                await redis.delete(key)
    finally:
        await redis.delete(key)
        await redis.aclose()
    return cells


def fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(a pass, an event) of the least-squares line through (size, µs a pass)."""
    xs, ys = zip(*points, strict=True)
    if len(set(xs)) < 2:
        return 0.0, ys[0] / xs[0]
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def summary(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians a size, and the line over them, for the gateway and for Redis."""
    rows = []
    for size in dict.fromkeys(c["size"] for c in cells):
        mine = [c for c in cells if c["size"] == size]
        redis = [c["redis_us"] for c in mine if c["redis_us"] is not None]
        rows.append(
            {
                "size": size,
                "gateway_us": statistics.median(c["gateway_us"] for c in mine),
                "redis_us": statistics.median(redis) if redis else None,
            }
        )
    lines = {}
    for side in ("gateway_us", "redis_us"):
        points = [(r["size"], r[side] * r["size"]) for r in rows if r[side] is not None]
        if points:
            a_pass, an_event = fit(points)
            lines[side] = {"pass_us": a_pass, "event_us": an_event}
    return {"sizes": rows, "line": lines}


def report(result: dict[str, Any]) -> str:
    """The Markdown table."""
    lines = [
        "| events a pass | gateway µs an event | Redis µs an event |",
        "|--:|--:|--:|",
    ]
    for row in result["sizes"]:
        redis = "-" if row["redis_us"] is None else f"{row['redis_us']:.2f}"
        lines.append(f"| {row['size']} | {row['gateway_us']:.2f} | {redis} |")
    for side, title in (("gateway_us", "gateway"), ("redis_us", "Redis")):
        line = result["line"].get(side)
        if line is not None:
            lines.append(
                f"{title}: {line['pass_us']:.0f} µs a pass + {line['event_us']:.2f} µs an event"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; 0, or 1 when Redis refused a pass."""
    config = parse(argv)
    pinning = choose(not config.no_pin)
    before = load_average()
    pinning.join_servers()
    try:
        cells = uvloop.run(measure(config))
    except RuntimeError as exc:
        print(f"bench_handoff: {exc}", file=sys.stderr)
        return 1
    result = summary(cells)
    results = {
        "command": "python -m loadtests.bench_handoff",
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {k: v for k, v in vars(config).items() if k != "out"},
        "machine": describe(),
        "pinning": pinning.describe(),
        "load_average": {"before": before, "after": load_average()},
        "cells": cells,
        "summary": result,
    }
    config.out.parent.mkdir(parents=True, exist_ok=True)
    config.out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
