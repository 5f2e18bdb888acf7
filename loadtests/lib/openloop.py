"""An open-loop load generator: requests on a fixed schedule, latency from the intended send time.

wrk is closed-loop: a connection sends its next request only after the answer
to the last, so a slow answer delays the requests behind it and they are never
timed as late (coordinated omission). Here request ``i`` is due at
``start + i / rate`` whatever happened before; its latency runs from that
moment to the last byte of its answer, and is recorded in an HdrHistogram
(microseconds, 3 significant digits). A request due while every connection
waits for an answer queues, and its wait counts: what a user arriving then
would see.

``python -m loadtests.lib.openloop --url URL --rate R --duration S --sku SKU --tag T``
prints one line ``OPENLOOP_JSON {...}`` (see :func:`summary`); the bench runs
it pinned to the load generator's core. Every request is a new user with a new
request id (``u<tag>-<n>``, ``r<tag>-<n>``), as in ``purchase.lua``.

The generator checks itself: ``send_lag_ms`` is how late requests that found a
free connection were sent (the generator's own delay, up to one ``TICK_S`` by
design, which adds to the latencies it reports and never hides any), and ``achieved_rate`` the rate
actually sent. A generator that cannot send at the rate says so (``sustained``
false).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import urlsplit

import uvloop
from hdrh.histogram import HdrHistogram

MARKER = "OPENLOOP_JSON "
# Latencies from 1 us to 60 s, 3 significant digits.
LOWEST_US, HIGHEST_US, DIGITS = 1, 60_000_000, 3
# The schedule is kept when at least this share of the rate was sent. A late
# send (send_lag_ms) only makes latencies look worse, never better: each is
# timed from its due moment.
SUSTAINED_SHARE = 0.95
# How long in-flight requests may take to answer once the schedule has ended.
TAIL_S = 5.0
# The generator wakes at most once per tick and sends every request due by then.
# uvloop's timers count whole milliseconds: a shorter sleep returned at once,
# and between requests due less than 1 ms apart the generator spun, using its
# whole core (97 % at 4,000/s), which on a two-core machine is the core that
# Redis and PostgreSQL share with it. A request sent up to a tick late is timed
# from its due moment all the same (send_lag_ms shows the lateness).
TICK_S = 0.001


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection with at most one request in flight."""

    def __init__(self, run: OpenLoop) -> None:
        self._run = run
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.due = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, request: bytes, due: float) -> None:
        assert self.transport is not None
        self.due = due
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self._buffer[:end]).lower()
        at = head.find(b"content-length:")
        stop = head.find(b"\r\n", at)
        length = int(head[at + 15 : stop if stop >= 0 else len(head)])
        if len(self._buffer) < end + 4 + length:
            return
        status = int(head[9:12])
        del self._buffer[: end + 4 + length]
        self._run.answered(self, status)

    def connection_lost(self, exc: Exception | None) -> None:
        self._run.lost(self)


class OpenLoop:
    """Sends purchases at ``rate`` per second for ``duration_s`` over ``connections``."""

    def __init__(
        self, url: str, *, rate: float, duration_s: float, connections: int, sku: str, tag: str
    ) -> None:
        parts = urlsplit(url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._rate, self._duration, self._connections = rate, duration_s, connections
        self._head = (
            f"POST /v1/purchase HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n"
            "Content-Type: application/json\r\nContent-Length: "
        ).encode()
        self._body = f'{{"sku":"{sku}","user_id":"u{tag}-{{n}}","request_id":"r{tag}-{{n}}"}}'
        self.latency = HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)
        self.send_lag = HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)
        self.statuses: collections.Counter[int] = collections.Counter()
        self.errors = 0
        self.sent = 0
        self._free: list[_Connection] = []
        self._waiting: collections.deque[float] = collections.deque()
        self._in_flight = 0
        self._done = asyncio.Event()
        self._scheduled_all = False

    @property
    def rate(self) -> float:
        """Requests per second asked for."""
        return self._rate

    def _request(self) -> bytes:
        body = self._body.replace("{n}", str(self.sent)).encode()
        return self._head + str(len(body)).encode() + b"\r\n\r\n" + body

    def _send(self, conn: _Connection, due: float) -> None:
        conn.send(self._request(), due)
        self.sent += 1
        self._in_flight += 1

    def _dispatch(self, due: float, now: float) -> None:
        # The generator's own lateness: how long after its due moment a request
        # went out although a connection was free (queueing is not counted).
        if self._free:
            self.send_lag.record_value(max(LOWEST_US, int((now - due) * 1e6)))
            self._send(self._free.pop(), due)
        else:
            self._waiting.append(due)

    def answered(self, conn: _Connection, status: int) -> None:
        """An answer arrived on ``conn``: record it, and reuse the connection."""
        now = time.perf_counter()
        self.latency.record_value(min(HIGHEST_US, max(LOWEST_US, int((now - conn.due) * 1e6))))
        self.statuses[status] += 1
        self._in_flight -= 1
        if self._waiting:
            self._send(conn, self._waiting.popleft())
        else:
            self._free.append(conn)
        self._check_done()

    def lost(self, conn: _Connection) -> None:
        """A connection closed: a request it carried counts as an error."""
        if conn in self._free:
            self._free.remove(conn)
        elif conn.due:
            self.errors += 1
            self._in_flight -= 1
            self._check_done()

    def _check_done(self) -> None:
        if self._scheduled_all and self._in_flight == 0 and not self._waiting:
            self._done.set()

    async def run(self) -> dict[str, Any]:
        """Connect, keep the schedule, wait for the last answers; returns :func:`summary`."""
        loop = asyncio.get_running_loop()
        for _ in range(self._connections):
            _, conn = await loop.create_connection(
                lambda: _Connection(self), self._host, self._port
            )
            self._free.append(conn)
        total = int(self._rate * self._duration)
        start = time.perf_counter()
        i = 0
        while i < total:
            # Send every request already due, back to back, each timed from its
            # own due moment; then yield to the loop (answers are read there)
            # until the next one is due.
            now = time.perf_counter()
            while i < total and start + i / self._rate <= now:
                self._dispatch(start + i / self._rate, now)
                i += 1
            await asyncio.sleep(max(TICK_S, start + i / self._rate - time.perf_counter()))
        elapsed = time.perf_counter() - start
        self._scheduled_all = True
        self._check_done()
        try:
            async with asyncio.timeout(TAIL_S):
                await self._done.wait()
        except TimeoutError:
            self.errors += self._in_flight + len(self._waiting)
        return summary(self, total, elapsed)

    def close(self) -> None:
        """Close every connection."""
        for conn in self._free:
            if conn.transport is not None:
                conn.transport.close()


def _percentiles(histogram: HdrHistogram) -> dict[str, float]:
    """p50, p90, p99, p99.9 and max in milliseconds."""
    if histogram.get_total_count() == 0:
        return {}
    points = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p999": 99.9}
    found = {k: histogram.get_value_at_percentile(p) / 1000 for k, p in points.items()}
    found["max"] = histogram.get_max_value() / 1000
    return found


def summary(run: OpenLoop, scheduled: int, elapsed_s: float) -> dict[str, Any]:
    """What one open-loop run saw: the rate asked and sent, latencies, statuses, errors."""
    achieved = run.sent / elapsed_s if elapsed_s > 0 else 0.0
    lag = _percentiles(run.send_lag)
    sustained = achieved >= SUSTAINED_SHARE * run.rate
    return {
        "rate": run.rate,
        "scheduled": scheduled,
        "sent": run.sent,
        "achieved_rate": achieved,
        "answered": sum(run.statuses.values()),
        "statuses": {str(k): v for k, v in sorted(run.statuses.items())},
        "errors": run.errors,
        "latency_ms": _percentiles(run.latency),
        "send_lag_ms": lag,
        "sustained": sustained,
        "histogram": run.latency.encode().decode(),
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    run = OpenLoop(
        args.url,
        rate=args.rate,
        duration_s=args.duration,
        connections=args.connections,
        sku=args.sku,
        tag=args.tag,
    )
    try:
        return await run.run()
    finally:
        run.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m loadtests.lib.openloop``."""
    parser = argparse.ArgumentParser(prog="python -m loadtests.lib.openloop", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of schedule")
    parser.add_argument("--connections", type=int, default=256)
    parser.add_argument("--sku", required=True)
    parser.add_argument("--tag", default="o")
    args = parser.parse_args(argv)
    result = uvloop.run(_main(args))
    print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
