"""The order events' delivery lag, as a consumer of the stream sees it.

``python -m loadtests.lib.stream_lag --redis-url URL --stream KEY --seconds S``
reads the stream from its end (``XREAD BLOCK``, up to 1,000 entries a call)
for ``S`` seconds at most, and takes each entry's lag: the moment the read
returned it less its ``occurred_at`` (PostgreSQL's clock at the start of the
transaction that made the order, in milliseconds; the same machine's clock).
Entries that occurred before the reader started (a warm-up's) are left out.
It prints ``READY`` once it is reading, then, at the end, one line
``LAG_JSON {...}``: the count and the p50, p90, p99 and max in ms.

``loadtests.bench_stack`` runs it on the load generator's core beside wrk, so
the reading costs the stack's core nothing but Redis's answers. The bench takes
their command time out of Redis's CPU (``INFO commandstats``), not Redis's
writes of them: 0.4-0.95 µs an event more, which the relay-on rounds' Redis
share still carries (a private Redis, 60,000 XADDs of 10 fields in pipelines
of 200, with and without this reader, 3 rounds each, 2026-12-07: 2.8-3.2 µs
an event without, 4.7-5.2 with, of which XREAD's command time 1.3-1.4).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import redis

MARKER = "LAG_JSON "
READ_COUNT = 1000
BLOCK_MS = 100


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """count, p50, p90, p99 and max of ``values`` (nearest rank), in the same unit."""
    ordered = sorted(values)
    if not ordered:
        return {"count": 0}

    def rank(p: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]

    return {
        "count": len(ordered),
        "p50": rank(50),
        "p90": rank(90),
        "p99": rank(99),
        "max": ordered[-1],
    }


def _occurred(fields: dict[bytes, bytes]) -> float | None:
    raw = fields.get(b"occurred_at")
    if raw is None:
        return None
    return datetime.fromisoformat(raw.decode()).timestamp()


def read_lags(url: str, stream: str, seconds: float) -> list[float]:
    """Lags in ms of the entries appended to ``stream`` within ``seconds`` from now."""
    client = redis.Redis.from_url(url, socket_timeout=5.0)
    lags: list[float] = []
    try:
        # From the newest entry now (XREAD's "$" again at each call would skip
        # what was appended between two calls).
        newest: Any = client.xrevrange(stream, count=1)
        last = newest[0][0] if newest else "0-0"
        began = time.time()
        deadline = time.monotonic() + seconds
        print("READY", flush=True)
        # Bounded by the deadline: each call blocks at most BLOCK_MS.
        while time.monotonic() < deadline:
            answer: Any = client.xread({stream: last}, count=READ_COUNT, block=BLOCK_MS)
            if not answer:
                continue
            now = time.time()
            entries = answer[0][1]
            last = entries[-1][0]
            for _id, fields in entries:
                occurred = _occurred(fields)
                if occurred is not None and occurred >= began:
                    lags.append((now - occurred) * 1000)
    finally:
        client.close()
    return lags


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: read, then print the ``LAG_JSON`` line."""
    parser = argparse.ArgumentParser(prog="python -m loadtests.lib.stream_lag")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    lags = read_lags(args.redis_url, args.stream, args.seconds)
    summary = {k: round(v, 2) for k, v in percentiles(lags).items()}
    print(MARKER + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
