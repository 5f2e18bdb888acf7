"""Sinks that come late and sinks that go (issue 40.5 and 40.6), on a real
PostgreSQL and Redis, with the real stream sink and the real webhook sink
POSTing to a loopback receiver, each test on a database of its own.

A webhook registered after events were written is owed none of them until an
operator asks: ``events --redeliver-since T --sink webhook`` makes every event
since T due for it, delivered elsewhere or not, and ``--redeliver EVENT_ID`` does
the same for one event already delivered to it. ``events --drop-sink`` forgets
a sink and all it is owed, and a relay starting without a sink still owed
events says so once."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from gateway.domain.events import EventSink
from gateway.outbound.webhook import WebhookSink
from gateway.postgres.outbox import Outbox
from gateway.redis.event_stream import EventStream
from gateway.settings import Settings, load
from gateway.usecases.relay import Relay
from testkit.commands import REPO, run_events
from testkit.gateways import gateway_env
from testkit.order_events import WRITE_EVENTS, Observed, check_arrivals
from testkit.webhook_receivers import Receiver, receiving

SECRET = "sink-changes-test-secret-0123456"
ORDERS, VERSIONS = 6, 2
# Passes at most to empty a sink's backlog: far more than the events need.
PASSES = 100


@pytest.fixture
async def pool(events_db: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the test's database."""
    p = await asyncpg.create_pool(events_db, min_size=1, max_size=6)
    assert p is not None
    yield p
    await p.close()


@asynccontextmanager
async def webhook_sink(url: str) -> AsyncIterator[WebhookSink]:
    """The real webhook sink, POSTing to ``url``."""
    settings = load({"GATEWAY_WEBHOOK_URL": url, "GATEWAY_WEBHOOK_SECRET": SECRET})
    sink = WebhookSink(settings, lambda klass: None)
    try:
        yield sink
    finally:
        await sink.close()


def stream_sink(redis: Redis, key: str) -> EventStream:
    """The real stream sink on ``key``, never trimmed."""
    return EventStream(redis, key, max_len=0, max_age_s=86_400, webhook_owed=None)


def relay(pool: asyncpg.Pool, sinks: Sequence[EventSink]) -> Relay:
    """A relay to ``sinks`` (its loops are not run: the test drives its passes)."""
    return Relay(outbox=Outbox(pool), sinks=sinks, observer=Observed(), batch=4, poll_s=0.01)


async def drain(r: Relay, sink: EventSink) -> int:
    """Passes of ``r`` for ``sink`` until one claims nothing; the events claimed."""
    claimed = 0
    for _ in range(PASSES):
        got = await r.relay_once(sink)
        if not got:
            return claimed
        claimed += got
    raise AssertionError(f"still claiming after {PASSES} passes")


async def stream_entries(redis: Redis, key: str) -> list[dict[str, str]]:
    """The stream's entries, in stream order, as text fields."""
    entries: list[tuple[bytes, dict[bytes, bytes]]] = await redis.xrange(key)  # type: ignore[assignment]
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


async def event_ids(pool: asyncpg.Pool) -> dict[tuple[str, int], str]:
    """Every event of the outbox, (order_id, version) -> event_id."""
    rows = await pool.fetch("SELECT order_id::text, version, event_id::text FROM order_events")
    return {(r[0], r[1]): r[2] for r in rows}


def posted(receiver: Receiver) -> list[dict[str, Any]]:
    """What the receiver was POSTed, in arrival order."""
    return [json.loads(r.body) for r in receiver.received]


class TestLateSink:
    """A webhook registered after the events it wants were delivered to the stream."""

    async def test_redeliver_since_owes_a_late_sink_every_event_since_a_time(
        self,
        pool: asyncpg.Pool,
        events_db: str,
        redis: Redis,
        key_prefix: str,
        make_settings: Callable[..., Settings],
    ) -> None:
        """The stream takes every event; a webhook registered afterwards gets none
        by itself. ``--redeliver-since T --sink webhook`` prints the count, exits 0,
        and the webhook then gets every event, each order's versions in order,
        while the stream gets nothing again."""
        key = f"{key_prefix}:events"
        stream = stream_sink(redis, key)
        before = datetime.now(UTC) - timedelta(minutes=1)
        first = relay(pool, [stream])
        await first.register()
        await pool.execute(WRITE_EVENTS, ORDERS, VERSIONS)
        assert await drain(first, stream) == ORDERS * VERSIONS
        receiver = Receiver(status=204)
        async with receiving(receiver) as url, webhook_sink(url) as hook:
            late = relay(pool, [stream, hook])
            await late.register()
            assert await drain(late, hook) == 0, "owed events written before it registered"
            settings = make_settings(database_url=events_db)
            since = before.isoformat().replace("+00:00", "Z")
            code, out, err = await run_events(
                settings, "--redeliver-since", since, "--sink", "webhook"
            )
            assert code == 0, (out, err)
            assert f"redelivered {ORDERS * VERSIONS} deliveries" in out, out
            assert await drain(late, stream) == 0, "the stream was not asked for anything"
            assert await drain(late, hook) == ORDERS * VERSIONS
        check_arrivals(posted(receiver), await event_ids(pool))
        assert len(receiver.received) == ORDERS * VERSIONS
        assert len(await stream_entries(redis, key)) == ORDERS * VERSIONS

    async def test_redeliver_makes_an_event_already_delivered_due_again(
        self,
        pool: asyncpg.Pool,
        events_db: str,
        redis: Redis,
        key_prefix: str,
        make_settings: Callable[..., Settings],
    ) -> None:
        """An event delivered to both sinks: ``--redeliver ID --sink webhook`` makes it
        due for the webhook alone (exit 0), which gets it again with its
        event_id; without ``--sink`` every registered sink gets it once more. A
        sink no relay registered is exit 2, and nothing is owed to it."""
        key = f"{key_prefix}:events"
        stream = stream_sink(redis, key)
        receiver = Receiver(status=200)
        async with receiving(receiver) as url, webhook_sink(url) as hook:
            r = relay(pool, [stream, hook])
            await r.register()
            await pool.execute(WRITE_EVENTS, 1, 1)
            event_id = await pool.fetchval("SELECT event_id::text FROM order_events")
            assert await drain(r, stream) == 1 and await drain(r, hook) == 1
            settings = make_settings(database_url=events_db)
            code, out, err = await run_events(
                settings, "--redeliver", event_id, "--sink", "webhook"
            )
            assert code == 0 and "redelivered 1 deliveries" in out, (out, err)
            assert await drain(r, stream) == 0
            assert await drain(r, hook) == 1
            code, out, err = await run_events(settings, "--redeliver", event_id)
            assert code == 0 and "redelivered 2 deliveries" in out, (out, err)
            assert await drain(r, stream) == 1 and await drain(r, hook) == 1
            code, out, err = await run_events(settings, "--redeliver", event_id, "--sink", "webhok")
            assert code == 2 and "webhok" in err, (out, err)
        assert [e["event_id"] for e in posted(receiver)] == [event_id] * 3
        assert [e["event_id"] for e in await stream_entries(redis, key)] == [event_id] * 2
        assert await pool.fetchval("SELECT count(*) FROM events_owed") == 0


class TestDroppedSink:
    """A webhook taken out of the configuration while it is owed events."""

    async def test_drop_sink_forgets_every_event_owed_to_it(
        self,
        pool: asyncpg.Pool,
        events_db: str,
        redis: Redis,
        key_prefix: str,
        make_settings: Callable[..., Settings],
    ) -> None:
        """A webhook refusing everything is owed events in both shapes (batches
        never tried, and deliveries refused). A relay that starts without it
        logs one warning naming it with the count; ``--drop-sink webhook``
        forgets all of it (exit 0): nothing listed, nothing owed, no longer
        registered, and events written afterwards are not owed to it."""
        stream = stream_sink(redis, f"{key_prefix}:events")
        receiver = Receiver(status=503)
        async with receiving(receiver) as url, webhook_sink(url) as hook:
            r = relay(pool, [stream, hook])
            await r.register()
            await pool.execute(WRITE_EVENTS, ORDERS, VERSIONS)
            # One pass refuses the first versions: owed one by one from then on.
            assert await r.relay_once(hook) > 0
            # A later flush's first versions: a batch never tried.
            await pool.execute(WRITE_EVENTS, ORDERS, 1)
            await drain(r, stream)
        shapes = await pool.fetchrow(
            "SELECT (SELECT count(*) FROM event_batches WHERE sink = 'webhook'),"
            " (SELECT count(*) FROM event_deliveries WHERE sink = 'webhook')"
        )
        assert shapes is not None and shapes[0] > 0 and shapes[1] > 0, shapes
        settings = make_settings(database_url=events_db)
        owed = ORDERS * VERSIONS + ORDERS
        code, out, _ = await run_events(settings)
        assert f"sink webhook: {owed} owed" in out, out

        without = relay(pool, [stream])
        with capture_logs(processors=[merge_contextvars]) as logs:
            await without.register()
        warned = [e for e in logs if e["event"] == "events_owed_to_unconfigured_sink"]
        assert len(warned) == 1, logs
        assert warned[0]["sink"] == "webhook" and warned[0]["owed"] == owed
        assert warned[0]["log_level"] == "warning"

        code, out, err = await run_events(settings, "--drop-sink", "webhook")
        assert code == 0 and f"{owed} owed events forgotten" in out, (out, err)
        code, out, _ = await run_events(settings)
        assert code == 0 and "webhook" not in out, out
        assert await pool.fetchval("SELECT count(*) FROM events_owed WHERE sink = 'webhook'") == 0
        assert await pool.fetchval("SELECT count(*) FROM event_sinks WHERE name = 'webhook'") == 0
        await pool.execute(WRITE_EVENTS, 2, 2)
        assert await pool.fetchval("SELECT count(*) FROM events_owed WHERE sink = 'webhook'") == 0
        with capture_logs(processors=[merge_contextvars]) as logs:
            await without.register()
        assert not [e for e in logs if e["event"] == "events_owed_to_unconfigured_sink"]
        code, out, _ = await run_events(settings, "--drop-sink", "webhook")
        assert code == 1 and "no sink 'webhook'" in out, out


class TestListingPiped:
    """``flashsale-gateway events | head``."""

    async def test_a_reader_gone_ends_the_listing_without_a_traceback(
        self, events_db: str, make_settings: Callable[..., Settings]
    ) -> None:
        """Its stdout a pipe whose reader closed before anything was written (as
        ``head`` does once it has its lines): exit 0, nothing on stderr."""
        settings = make_settings(database_url=events_db)
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gateway",
                "events",
                env=gateway_env({"database_url": settings.database_url}),
                cwd=REPO,
                stdout=write_end,
                stderr=asyncio.subprocess.PIPE,
            )
        finally:
            os.close(write_end)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0 and not err, err.decode()
