"""The event stream: the sink that appends each order event to one Redis Stream.

Every event is one entry of ``GATEWAY_EVENTS_STREAM`` (default
``flashsale:events``) whose fields are the event's (``OrderEvent.fields``),
read by consumer groups (XREADGROUP, XACK; README, "Events"). A claim's
events go in one round trip: on one Redis as one XADD each, packed by
PostgreSQL (``OrderEvent.packed``: the gateway decodes one string per event
and packs only the XADD's head), since a Lua script's call of XADD cost Redis
3.5 µs an event against 1.7 for the command itself (issue 42;
docs/performance.md, "Order events"); on a cluster as their fields, in one
call of ``lua/append_events.lua``. One key, so one slot of a Redis Cluster: a
batch is one round trip to one node. A batch's last XADD trims the stream,
approximately (``~``, whole macro nodes):

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
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError, RedisError

from gateway.domain.errors import Unavailable
from gateway.domain.events import FirstEvents, OrderEvent, SinkName
from gateway.domain.model import Order
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
# A hand-off's appends trim the stream at most this often (a relay's every batch).
HANDOFF_TRIM_S = 1.0

# What a batch's last XADD trims by: MAXLEN or MINID and the threshold; None: nothing.
Trim = tuple[str, int] | None

# When the oldest event still owed to the webhook occurred; None: none is.
OwedFloor = Callable[[], Awaitable[datetime | None]]
# A packed event's start: its number of fields as a bulk string ("$2", CRLF,
# two digits, CRLF; sql/functions/event_packed.sql). Its XADD's head replaces it.
COUNT_PREFIX = len("$2\r\n20\r\n")


def _ms(entry_id: str | bytes) -> int:
    """The milliseconds part of a stream entry id (as a client decoding replies
    or not answers it)."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])


def _size(text: str) -> int:
    """``text``'s length in bytes, as RESP counts it."""
    return len(text) if text.isascii() else len(text.encode())


def packed_firsts(flush: FirstEvents) -> list[str]:
    """The first events of a flush's new orders, each as ``event_packed`` packs
    the outbox's row of the same event (``sql/functions/event_packed.sql``;
    ``sql/032_event_handoff.sql``: its id is the order's, its cause ``buyer``),
    so a hand-off and a relay append the same entry. What a flush's orders
    share (sku, status, pay_by, when) is packed once per flush."""
    occurred = f"$7\r\nversion\r\n$1\r\n1\r\n$11\r\noccurred_at\r\n$24\r\n{flush.occurred_at}\r\n"
    shared: dict[tuple[str, str, str | None], tuple[str, str, str, str]] = {}
    texts = []
    for order in flush.orders:
        common = shared.get((order.sku, order.status, order.pay_by))
        if common is None:
            common = shared[order.sku, order.status, order.pay_by] = _shared(order, occurred)
        count, kind, sku, rest = common
        rid, uid, qty = order.request_id, order.user_id, str(order.qty)
        texts.append(
            f"{count}$8\r\nevent_id\r\n$36\r\n{order.order_id}\r\n{kind}"
            f"$8\r\norder_id\r\n$36\r\n{order.order_id}\r\n"
            f"$10\r\nrequest_id\r\n${_size(rid)}\r\n{rid}\r\n{sku}"
            f"$7\r\nuser_id\r\n${_size(uid)}\r\n{uid}\r\n"
            f"$3\r\nqty\r\n${len(qty)}\r\n{qty}\r\n{rest}"
        )
    return texts


def _shared(order: Order, occurred: str) -> tuple[str, str, str, str]:
    """What the first events of a flush's orders like ``order`` share: the count
    of fields, the type, the sku, and the rest after qty (status, version,
    occurred_at, pay_by, cause)."""
    kind, status, pay_by = f"order.{order.status}", order.status, order.pay_by
    return (
        "$2\r\n22\r\n" if pay_by is None else "$2\r\n24\r\n",
        f"$4\r\ntype\r\n${len(kind)}\r\n{kind}\r\n",
        f"$3\r\nsku\r\n${_size(order.sku)}\r\n{order.sku}\r\n",
        f"$6\r\nstatus\r\n${len(status)}\r\n{status}\r\n{occurred}"
        + ("" if pay_by is None else f"$6\r\npay_by\r\n$24\r\n{pay_by}\r\n")
        + "$5\r\ncause\r\n$5\r\nbuyer\r\n",
    )


def _xadd(key: str, trim: Trim) -> tuple[str | int, ...]:
    """An XADD's arguments before its fields: a new entry's id and, on a batch's
    last, its approximate trim."""
    return ("XADD", key, *(() if trim is None else (trim[0], "~", trim[1])), "*")


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
        # The XADD's head before a packed event's fields, by the event's count
        # prefix (20 to 28 fields: a handful of heads).
        self._heads: dict[str, str] = {}
        self._script = read_script("append_events")
        # The newest entry's milliseconds: where an age trim counts back from.
        self._newest_ms: int | None = None
        # When a hand-off's append last trimmed (monotonic): at most once a
        # HANDOFF_TRIM_S, not every pass (with a webhook, each trim asks
        # PostgreSQL for its oldest owed event).
        self._handoff_trimmed = -math.inf

    @property
    def packed(self) -> bool:
        """Whether the relay claims events packed for this sink: on one Redis,
        where the XADDs' bytes are written as they are. A cluster's pipeline
        routes and packs commands itself, so it takes the events' fields."""
        return isinstance(self._redis, Redis)

    async def deliver(self, events: Sequence[OrderEvent]) -> Sequence[str | None]:
        """Append each event, all in one round trip; None for each appended,
        else why not. Packed, a refused XADD does not stop the next: a claim
        holds one event of an order at most, and an order's next event waits
        for the refused one (the outbox's per-order order)."""
        packed = self.packed and all(e.packed for e in events)
        return await self._deliver([e.packed for e in events] if packed else None, events)

    async def hand_off(self, flushes: Sequence[FirstEvents]) -> list[bool]:
        """Append the first events of each flush's new orders, all in one round
        trip (as :meth:`deliver` appends packed events); per flush whether every
        one of its events was appended. Only on one Redis (:attr:`packed`)."""
        texts = [text for flush in flushes for text in packed_firsts(flush)]
        now = time.monotonic()
        trimming = now - self._handoff_trimmed >= HANDOFF_TRIM_S
        if trimming:
            self._handoff_trimmed = now
        answers = iter(await self._deliver(texts, (), trimming=trimming))
        return [all([next(answers) is None for _ in flush.orders]) for flush in flushes]

    async def _deliver(
        self, texts: Sequence[str] | None, events: Sequence[OrderEvent], *, trimming: bool = True
    ) -> Sequence[str | None]:
        """Append ``texts`` (packed events) or else ``events`` (as fields), the
        last one trimming the stream unless not ``trimming``; see :meth:`deliver`."""
        count = len(events) if texts is None else len(texts)
        if not count:
            return []
        trim = await self._trim() if trimming else None
        wait = (("WAIT", self._replicas, REPLICA_WAIT_MS),) if self._replicas else ()
        try:
            with connection_errors():
                if texts is not None:
                    assert isinstance(self._redis, Redis)
                    packed = self._packed(trim, texts) + b"".join(map(pack, wait))
                    replies = await packed_many(self._redis, packed, count + len(wait))
                    appended = replies[:count]
                else:
                    replies = await self._append(trim, events, wait)
                    appended = replies[:1] * count
        except RedisError as exc:
            return [f"redis: {type(exc).__name__}"] * count
        short = self._short_of_replicas(replies[-1]) if self._replicas else None
        # Each reply is an entry id, or the error Redis answered: looked at one
        # by one only when some error is among them (a pass in C otherwise).
        if all(issubclass(kind, str | bytes) for kind in set(map(type, appended))):
            self._newest_ms = max(self._newest_ms or 0, _ms(appended[-1]))
            return [short] * len(appended)
        ids = [r for r in appended if not isinstance(r, Exception)]
        if ids:
            self._newest_ms = max(self._newest_ms or 0, _ms(ids[-1]))
        return [f"redis: {r}" if isinstance(r, Exception) else short for r in appended]

    async def _append(
        self, trim: Trim, events: Sequence[OrderEvent], wait: Sequence[tuple[str | int, ...]]
    ) -> list[Any]:
        """Events given as fields, in one call of the append script (packed and
        routed by the client: on a cluster, its pipeline, which packs and reads
        each command in Python, 13 µs an event more for XADDs than for the
        script's arguments; docs/performance.md, "Order events"). Its reply,
        the last entry's id, answers for all: a refused XADD ends the script."""
        args: list[str | int] = ["", 0] if trim is None else [*trim]
        for event in events:
            args.append(len(event.fields))
            args.extend(event.fields)
        commands = [("EVALSHA", self._script.sha, 1, self._key, *args), *wait]
        replies = await commands_many(self._redis, commands, node_of=self._key)
        # Loaded by its first call, and again after a restart or a failover.
        if isinstance(replies[0], NoScriptError):
            await self._script.load(self._redis)
            replies = await commands_many(self._redis, commands, node_of=self._key)
        return replies

    def _packed(self, trim: Trim, texts: Sequence[str]) -> bytes:
        """The XADDs of packed events (PostgreSQL's, or a hand-off's): each
        event's fields as they are, behind its XADD's head, packed here once per
        number of fields."""
        heads = self._heads
        last = texts[-1]
        parts: list[str] = []
        for packed in texts[:-1]:
            head = heads.get(packed[:COUNT_PREFIX])
            if head is None:
                head = heads[packed[:COUNT_PREFIX]] = self._head(packed, None)
            parts += (head, packed[COUNT_PREFIX:])
        parts += (self._head(last, trim), last[COUNT_PREFIX:])
        return "".join(parts).encode()

    def _head(self, packed: str, trim: Trim) -> str:
        """The XADD's head for a packed event: the array's length (the head's
        arguments and the fields), then the head's arguments."""
        args = _xadd(self._key, trim)
        head = pack(args).decode()
        fields = int(packed[4 : COUNT_PREFIX - 2])
        return f"*{len(args) + fields}\r\n" + head[head.index("\r\n") + 2 :]

    def _short_of_replicas(self, reached: int | Exception) -> str | None:
        """Why a batch whose WAIT answered ``reached`` is not delivered; None: it is."""
        if isinstance(reached, Exception):
            return f"redis: WAIT: {reached}"
        if reached < self._replicas:
            return f"redis: on {reached} of {self._replicas} replicas after {REPLICA_WAIT_MS} ms"
        return None

    async def _trim(self) -> Trim:
        """What the batch's last XADD trims by: MAXLEN or MINID and the
        threshold; None: nothing."""
        floor_ms: int | None = None
        if self._webhook_owed is not None:
            try:
                owed = await self._webhook_owed()
            except Unavailable:
                return None
            if owed is not None:
                floor_ms = math.floor((owed.timestamp() - SKEW_MARGIN_S) * 1000)
        if self._max_len:
            return None if floor_ms is not None else ("MAXLEN", self._max_len)
        if not self._keep_ms or self._newest_ms is None:
            return None
        bound = self._newest_ms - self._keep_ms
        if floor_ms is not None:
            bound = min(bound, floor_ms)
        return ("MINID", bound) if bound > 0 else None
