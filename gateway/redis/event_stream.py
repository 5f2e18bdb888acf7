"""The event stream: the sink that appends each order event to one Redis Stream.

Every event is one entry of ``GATEWAY_EVENTS_STREAM`` (default
``flashsale:events``) whose fields are the event's (``OrderEvent.fields``),
read by consumer groups (XREADGROUP, XACK; README, "Events"). A claim's
events go in one call of ``lua/append_events.lua``, on one Redis packed by
PostgreSQL (``OrderEvent.packed``: the gateway decodes one string per event,
packs none, and reads one reply), on a cluster as their fields. One
key, so one slot of a Redis Cluster: a batch is one call to one node. A
batch's last XADD trims the stream, approximately (``~``, whole macro nodes):

- by length (``GATEWAY_EVENTS_STREAM_MAX_LEN``) when set, else by age
  (``GATEWAY_EVENTS_STREAM_MAX_AGE_S``, counted back from the newest entry's
  id, Redis's clock);
- and never past an event still owed to the webhook, when one is configured:
  the MINID stays :data:`SKEW_MARGIN_S` before the oldest owed event's
  occurred_at (PostgreSQL's clock), and a length trim waits while any is owed.
  When that cannot be known (PostgreSQL down), the batch does not trim.

With ``replicas`` (``GATEWAY_EVENTS_STREAM_REPLICAS``; 1 by default with
Sentinels or a Cluster) the batch ends with ``WAIT replicas`` on the same
connection: its events count as delivered only once that many replicas hold
them, so a failover to a replica cannot lose an event the outbox forgot.
Replication is asynchronous; without the WAIT, an append acknowledged by a
primary that dies a millisecond later is gone from the promoted replica.
When fewer replicas answer within :data:`REPLICA_WAIT_MS` the batch is
refused and retried (its entries may then appear twice, with one event_id).

Driver errors are answered per event, never raised (``EventSink``).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError, RedisError

from gateway.domain.errors import Unavailable
from gateway.domain.events import OrderEvent, SinkName
from gateway.lock import connection_errors
from gateway.redis.connections import RedisClient
from gateway.redis.scripts import commands_many, pack, packed_many, read_script

# An entry's id is Redis's clock when it was appended, at or after its event
# occurred by PostgreSQL's. Two hosts' clocks disagree by well under this
# (NTP keeps them within milliseconds), so a MINID this far before the event
# never trims its entry.
SKEW_MARGIN_S = 60.0
# How long a batch waits for its replicas before it is refused and retried.
REPLICA_WAIT_MS = 1000

# The append script's trim arguments when the call trims nothing.
NO_TRIM = ("", 0)

# When the oldest event still owed to the webhook occurred; None: none is.
OwedFloor = Callable[[], Awaitable[datetime | None]]
# One attempt of an append, sent again after the script was loaded.
Send = Callable[[], Awaitable[list[Any]]]


def _arguments(event: OrderEvent) -> int:
    """The append script's arguments a packed event takes: its number of
    fields, then the fields. event_packed writes that number first, always
    two digits (20 to 28: "$2", CRLF, the digits), so it is read from there
    (splitting the text cost 0.8 µs an event, a few hundred a claim)."""
    return 1 + int(event.packed[4:6])


def _ms(entry_id: str | bytes) -> int:
    """The milliseconds part of a stream entry id (as a client decoding replies
    or not answers it)."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])


class EventStream:
    """The ``stream`` sink (``EventSink``): XADD, never dead-lettered.

    Args:
        redis: the gateway's client.
        key: the stream's key (``GATEWAY_EVENTS_STREAM``).
        max_len: entries kept, approximately; 0: trim by age.
        max_age_s: seconds of entries kept, by their ids; 0: never trimmed by age.
        webhook_owed: the oldest event owed to the webhook, with a webhook sink
            configured; None without one.
        replicas: replicas each batch must reach (WAIT); 0: the primary's
            answer is enough.
    """

    name = SinkName.STREAM
    max_age_s: float | None = None

    def __init__(
        self,
        redis: RedisClient,
        key: str,
        *,
        max_len: int,
        max_age_s: float,
        webhook_owed: OwedFloor | None,
        replicas: int = 0,
    ) -> None:
        self._redis, self._key, self._replicas = redis, key, replicas
        self._max_len, self._keep_ms = max_len, math.floor(max_age_s * 1000)
        self._webhook_owed = webhook_owed
        self._append = read_script("append_events")
        # The newest entry's milliseconds: where an age trim counts back from.
        self._newest_ms: int | None = None

    @property
    def packed(self) -> bool:
        """Whether the relay claims events packed for this sink: on one Redis,
        where the append's bytes are written as they are. A cluster's pipeline
        routes and packs commands itself, so it takes the events' fields."""
        return isinstance(self._redis, Redis)

    async def deliver(self, events: Sequence[OrderEvent]) -> Sequence[str | None]:
        """Append each event, in one script call; None for each appended, else
        why not (the same answer for all: the call went through or it did not)."""
        if not events:
            return []
        trim = await self._trim()
        send = (
            self._send_packed(trim, events)
            if self.packed and all(e.packed for e in events)
            else self._send_fields(trim, events)
        )
        try:
            with connection_errors():
                replies = await send()
                # Loaded by its first call, and again after a restart or a failover.
                if isinstance(replies[0], NoScriptError):
                    await self._append.load(self._redis)
                    replies = await send()
        except RedisError as exc:
            return [f"redis: {type(exc).__name__}"] * len(events)
        appended = replies[0]
        if isinstance(appended, Exception):
            return [f"redis: {appended}"] * len(events)
        self._newest_ms = max(self._newest_ms or 0, _ms(appended))
        short = self._short_of_replicas(replies[1]) if self._replicas else None
        return [short] * len(events)

    def _wait(self) -> tuple[tuple[str | int, ...], ...]:
        """The WAIT that follows the append when replicas must hold it."""
        return (("WAIT", self._replicas, REPLICA_WAIT_MS),) if self._replicas else ()

    def _send_fields(self, trim: tuple[str, int], events: Sequence[OrderEvent]) -> Send:
        """The append of events given as fields, packed by the client."""
        args: list[str | int] = [*trim]
        for event in events:
            args.append(len(event.fields))
            args.extend(event.fields)
        commands = [("EVALSHA", self._append.sha, 1, self._key, *args), *self._wait()]
        return lambda: commands_many(self._redis, commands, node_of=self._key)

    def _send_packed(self, trim: tuple[str, int], events: Sequence[OrderEvent]) -> Send:
        """The append of events PostgreSQL packed: the command's head, packed
        here, then their bytes as they are. Each event's part starts with its
        number of fields, the first bulk string: one argument for it and one
        per field."""
        assert isinstance(self._redis, Redis)
        redis = self._redis
        head_args = ("EVALSHA", self._append.sha, 1, self._key, *trim)
        head = pack(head_args)
        count = len(head_args) + sum(map(_arguments, events))
        wait = self._wait()
        # The head's own count ("*6" CRLF) gives way to the whole command's.
        packed = b"".join(
            [
                b"*%d\r\n" % count,
                head[head.index(b"\r\n") + 2 :],
                "".join([e.packed for e in events]).encode(),
                *map(pack, wait),
            ]
        )
        return lambda: packed_many(redis, packed, 1 + len(wait))

    def _short_of_replicas(self, reached: int | Exception) -> str | None:
        """Why a batch whose WAIT answered ``reached`` is not delivered; None: it is."""
        if isinstance(reached, Exception):
            return f"redis: WAIT: {reached}"
        if reached < self._replicas:
            return f"redis: on {reached} of {self._replicas} replicas after {REPLICA_WAIT_MS} ms"
        return None

    async def _trim(self) -> tuple[str, int]:
        """The append script's trim arguments: kind ("" none, MAXLEN, MINID) and
        threshold."""
        floor_ms: int | None = None
        if self._webhook_owed is not None:
            try:
                owed = await self._webhook_owed()
            except Unavailable:
                return NO_TRIM
            if owed is not None:
                floor_ms = math.floor((owed.timestamp() - SKEW_MARGIN_S) * 1000)
        if self._max_len:
            return NO_TRIM if floor_ms is not None else ("MAXLEN", self._max_len)
        if not self._keep_ms or self._newest_ms is None:
            return NO_TRIM
        bound = self._newest_ms - self._keep_ms
        if floor_ms is not None:
            bound = min(bound, floor_ms)
        return ("MINID", bound) if bound > 0 else NO_TRIM
