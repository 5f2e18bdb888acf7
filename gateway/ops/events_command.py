"""``flashsale-gateway events``: the order events owed to the sinks, and replays.

Without a flag it prints each sink's backlog, then one line per event owed to
a sink (undelivered, or dead-lettered past the sink's max age) with its
attempts, age and last error; it exits 0, or 1 when any is a dead letter.
``--replay EVENT_ID`` makes one event due again (with its order's earlier
dead letters, which go first), ``--replay-since TIME`` every owed event that
occurred at or after an RFC 3339 time; ``--sink NAME`` keeps to one sink.
A replay exits 0 when it revived something, 1 when nothing matched. Any of
them exits 2 when PostgreSQL cannot be read, the event id is not a UUID or
the time is not RFC 3339.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gateway.domain.errors import GatewayError
from gateway.postgres.database import create_pool
from gateway.postgres.outbox import Outbox, Owed, SinkStats
from gateway.settings import Misconfigured, Settings

# Lines listed at most; the backlog's counts above them are exact.
LIST_LIMIT = 1_000


@dataclass(frozen=True, slots=True)
class Request:
    """What the command was asked: a list, or a replay of one event or since a time."""

    replay: str | None = None
    replay_since: str | None = None
    sink: str | None = None


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
        if request.replay is not None:
            n = await outbox.replay(str(uuid.UUID(request.replay)), request.sink)
            return f"replayed {n} deliveries of event {request.replay}", 0 if n else 1
        if request.replay_since is not None:
            n = await outbox.replay_since(since(request.replay_since), request.sink)
            return f"replayed {n} deliveries since {request.replay_since}", 0 if n else 1
        stats, owed = await outbox.stats(), await outbox.owed(LIST_LIMIT)
        if request.sink is not None:
            stats = [s for s in stats if s.sink == request.sink]
            owed = [o for o in owed if o.sink == request.sink]
        return render(stats, owed), 1 if any(o.dead for o in owed) else 0
    finally:
        await pool.close()


def run(settings: Settings, request: Request) -> int:
    """The ``events`` command; returns its exit status (0, 1 or 2)."""
    try:
        text, status = asyncio.run(_execute(settings, request))
    except (GatewayError, Misconfigured, ValueError) as exc:
        print(f"flashsale-gateway events: {exc}", file=sys.stderr)
        return 2
    print(text, flush=True)
    return status
