"""``flashsale-gateway events``: the order events owed to the sinks, their
redelivery, and a sink dropped.

Without a flag it prints each sink's backlog, then one line per event owed to
a sink (undelivered, or dead-lettered past the sink's max age) with its
attempts, age and last error; it exits 0, or 1 when any is a dead letter.
A redelivery makes events due again at once, delivered or not, for ``--sink
NAME`` or every registered sink: ``--redeliver EVENT_ID`` one event (with its
order's earlier dead letters, which go first), ``--redeliver-since TIME`` every
event still in the outbox that occurred at or after an RFC 3339 time. It
exits 0 when something is due again, 1 when nothing matched (no such event,
or pruned). ``--drop-sink NAME`` forgets a sink and everything owed to it;
1 when it was not registered. Any of them exits 2 when PostgreSQL cannot be
read, the event id is not a UUID, the time is not RFC 3339 or ``--sink``
names no registered sink. A reader that stops reading early (``| head``)
ends the output quietly.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gateway.domain.errors import GatewayError
from gateway.domain.events import SinkStats
from gateway.postgres.database import create_pool
from gateway.postgres.outbox import Outbox, Owed
from gateway.settings import Misconfigured, Settings

# Lines listed at most; the backlog's counts above them are exact.
LIST_LIMIT = 1_000


@dataclass(frozen=True, slots=True)
class Request:
    """What the command was asked: a list, a redelivery of one event or since a
    time, or a sink to drop."""

    redeliver: str | None = None
    redeliver_since: str | None = None
    sink: str | None = None
    drop_sink: str | None = None


def since(text: str) -> datetime:
    """An RFC 3339 time with its offset; raises ValueError otherwise."""
    instant = datetime.fromisoformat(text)
    if instant.tzinfo is None:
        raise ValueError(f"{text!r} has no offset (write Z or +00:00)")
    return instant


def render(stats: Sequence[SinkStats], owed: Sequence[Owed]) -> str:
    """The backlog per sink, then one line per owed event."""
    lines = [
        f"sink {s.sink}: {s.depth} owed, {s.dead} dead, oldest {s.oldest_s:.1f}s" for s in stats
    ]
    for o in owed:
        state = "dead" if o.dead else "owed"
        lines.append(
            f"{o.sink}\t{state}\t{o.event_id}\t{o.type}\t{o.order_id}\tv{o.version}"
            f"\tattempts={o.attempts}\tage={o.age_s:.1f}s\t{o.last_error or '-'}"
        )
    if len(owed) >= LIST_LIMIT:
        lines.append(f"(the first {LIST_LIMIT} only)")
    return "\n".join(lines)


async def _execute(settings: Settings, request: Request) -> tuple[str, int]:
    """The text to print and the exit status."""
    pool = await create_pool(settings)
    try:
        outbox = Outbox(pool)
        if request.drop_sink is not None:
            return await _drop(outbox, request.drop_sink)
        if request.redeliver is not None or request.redeliver_since is not None:
            return await _redeliver(outbox, request)
        stats, owed = await outbox.stats(), await outbox.owed(LIST_LIMIT)
        if request.sink is not None:
            stats = [s for s in stats if s.sink == request.sink]
            owed = [o for o in owed if o.sink == request.sink]
        return render(stats, owed), 1 if any(o.dead for o in owed) else 0
    finally:
        await pool.close()


async def _redeliver(outbox: Outbox, request: Request) -> tuple[str, int]:
    """``--redeliver`` or ``--redeliver-since``: the count now due, and 0, or 1 for none."""
    sinks = await outbox.sinks()
    if request.sink is not None and request.sink not in sinks:
        # A typo would otherwise owe events to a sink no relay serves.
        raise ValueError(
            f"no sink {request.sink!r} is registered (registered: {', '.join(sinks) or 'none'});"
            " a gateway registers each sink it configures when it starts"
        )
    to = request.sink or ", ".join(sinks)
    if request.redeliver is not None:
        event_id = str(uuid.UUID(request.redeliver))
        n = await outbox.redeliver(event_id, request.sink)
        what = f"event {event_id}"
    else:
        assert request.redeliver_since is not None
        n = await outbox.redeliver_since(since(request.redeliver_since), request.sink)
        what = f"events since {request.redeliver_since}"
    if not n:
        return f"redelivered 0 deliveries: no {what} in the outbox (pruned, or none)", 1
    return f"redelivered {n} deliveries of {what} to {to}: due now", 0


async def _drop(outbox: Outbox, sink: str) -> tuple[str, int]:
    """``--drop-sink``: what went, and 0, or 1 when no such sink was registered."""
    registered, owed = await outbox.drop_sink(sink)
    if not registered:
        return f"no sink {sink!r} was registered; {owed} owed events dropped", 1
    return f"dropped sink {sink}: {owed} owed events forgotten", 0


def run(settings: Settings, request: Request) -> int:
    """The ``events`` command; returns its exit status (0, 1 or 2)."""
    try:
        text, status = asyncio.run(_execute(settings, request))
    except (GatewayError, Misconfigured, ValueError) as exc:
        print(f"flashsale-gateway events: {exc}", file=sys.stderr)
        return 2
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # The reader went (``| head``): what it read is what it wanted. Point
        # stdout at /dev/null so the interpreter's own flush at exit does not
        # raise again and print a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return status
