"""The order events' delivery lag, read from the stream once the window is over.

An entry's id is Redis's clock, in milliseconds, when the entry was appended:
the moment a consumer blocked on the stream is handed it. Its ``occurred_at``
is PostgreSQL's clock at the start of the transaction that made the event
(the same machine's clock). So each entry's delivery lag is its id's
milliseconds less its ``occurred_at``, to the millisecond, whenever it is read.

``loadtests.bench_stack`` reads the round's entries after its CPU window has
closed, so the reading costs the measured stack nothing. A reader beside the
load (``XREAD BLOCK`` on the load generator's core, before 2026-12-07) cost
Redis 0.4-0.95 µs an event in its writes of the answers even with XREAD's
command time taken out, charged to the relay-on rounds (a private Redis,
60,000 XADDs of 10 fields in pipelines of 200, 3 rounds each: 2.8-3.2 µs an
event without a reader, 4.7-5.2 with, of which XREAD's command time 1.3-1.4).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import redis

# Entries read a call; a round's are read in calls of this many.
READ_COUNT = 5000


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


def entry_lag_ms(entry_id: bytes, fields: dict[bytes, bytes]) -> tuple[float, float] | None:
    """(occurred_at in epoch ms, lag in ms) of one entry; None without ``occurred_at``."""
    raw = fields.get(b"occurred_at")
    if raw is None:
        return None
    occurred = datetime.fromisoformat(raw.decode()).timestamp() * 1000
    return occurred, int(entry_id.partition(b"-")[0]) - occurred


def read_lags(url: str, stream: str, since: float, until: float) -> list[float]:
    """Lags in ms of the entries of ``stream`` whose events occurred from
    ``since`` to ``until`` (epoch seconds): the window's, not a warm-up's."""
    client = redis.Redis.from_url(url, socket_timeout=30.0)
    lags: list[float] = []
    # Appended at or after it occurred: the window's entries have ids from its start.
    start: bytes | str = str(int(since * 1000))
    try:
        # Bounded: each call takes READ_COUNT entries further, up to the end.
        while True:
            entries: Any = client.xrange(stream, min=start, count=READ_COUNT)
            for entry_id, fields in entries:
                lag = entry_lag_ms(entry_id, fields)
                if lag is not None and since * 1000 <= lag[0] <= until * 1000:
                    lags.append(lag[1])
            if len(entries) < READ_COUNT:
                return lags
            start = b"(" + entries[-1][0]
    finally:
        client.close()
