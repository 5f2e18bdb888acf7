"""The Redis Streams adapter of the queue strategy: the writers' side of each
sku's stream, and what ``GET /v1/orders/{id}`` asks of a queued purchase.

``enqueue.lua`` (called by :class:`gateway.redis.reservations.Reservations`) reserves and
XADDs in one script; this adapter reads the entries in the consumer group
``writers`` (XREADGROUP), claims a dead writer's (XAUTOCLAIM) and, once a
batch is committed, records its rejections and acknowledges it (one pipeline
in the sku's slot). Keys and entry fields are ``gateway.redis.layout``'s. Driver errors
become :class:`gateway.domain.errors.RedisUnavailable` here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError, ResponseError

from gateway.domain.errors import RedisUnavailable
from gateway.domain.model import Purchase, Verdict
from gateway.lock import connection_errors
from gateway.redis.connections import RedisClient, redis_call
from gateway.redis.layout import (
    WRITERS_GROUP,
    KeyTags,
    encode_queued,
    queued_by,
    rejected_key,
    request_key,
    stream_key,
)
from gateway.settings import Settings


class StreamGone(Exception):
    """The sku's stream (and with it the writers' group) no longer exists: it
    expired, or was dropped. Its writer stops until a purchase makes it again."""


class GroupExists(Exception):
    """The writers' group is on the sku's stream already."""


def _stream_error(sku: str, exc: RedisError) -> Exception:
    """What a stream command's driver error means, told by the error code Redis
    answered with (the first word of its reply; redis-py types neither of these):
    NOGROUP, the stream and its group are gone; BUSYGROUP, the group exists;
    anything else, Redis is unavailable."""
    if isinstance(exc, ResponseError):
        code = str(exc).partition(" ")[0]
        if code == "NOGROUP":
            return StreamGone(sku)
        if code == "BUSYGROUP":
            return GroupExists(sku)
        return RedisUnavailable(f"redis: {exc}")
    return RedisUnavailable(f"redis: {type(exc).__name__}")


async def _stream_call(sku: str, call: Awaitable[Any]) -> Any:
    """Await a command on ``sku``'s stream; a driver error raises what
    :func:`_stream_error` says it means."""
    try:
        with connection_errors():
            return await call
    except RedisError as exc:
        raise _stream_error(sku, exc) from exc


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry: a reserved purchase waiting for its commit."""

    entry_id: str
    purchase: Purchase


@dataclass(frozen=True, slots=True)
class Depth:
    """How much a sku's stream holds: entries not yet acknowledged, and of
    those the ones a writer has read (the group's pending entries)."""

    length: int
    pending: int


def _entries(sku: str, raw: Iterable[tuple[str, Mapping[str, str] | None]]) -> list[Entry]:
    # An entry deleted while pending comes back without fields: nothing to do.
    return [
        Entry(
            entry_id,
            Purchase(sku, f["user"], int(f["qty"]), f["rid"], reserved_at_ms=int(f["at"])),
        )
        for entry_id, f in raw
        if f
    ]


class Streams:
    """Reads, claims, acknowledgements and lookups of the queue strategy's streams."""

    def __init__(self, redis: RedisClient, settings: Settings, tags: KeyTags | None = None) -> None:
        self.redis = redis
        # Each sku's limit group, which tags its keys (gateway.redis.layout).
        self._tags = KeyTags() if tags is None else tags
        self._prefix = settings.key_prefix
        self._retention_ms = max(1, round(settings.sale_retention_s * 1000))
        self._count = settings.batch_max
        self._block_ms = settings.writer_block_ms
        self._claim_idle_ms = max(1, round(settings.writer_claim_idle_s * 1000))
        self._max = settings.stream_max

    def _stream(self, sku: str) -> str:
        return stream_key(self._prefix, sku, self._tags.group_of(sku))

    def _rejected(self, sku: str) -> str:
        return rejected_key(self._prefix, sku, self._tags.group_of(sku))

    def group_of(self, sku: str) -> str | None:
        """The limit group ``sku`` is in, as this instance knows it."""
        return self._tags.group_of(sku)

    async def ensure_group(self, sku: str) -> None:
        """Create the writers' group on the sku's stream, reading from its start:
        entries queued before the group existed are read too."""
        key = self._stream(sku)
        try:
            await _stream_call(
                sku, self.redis.xgroup_create(key, WRITERS_GROUP, "0", mkstream=True)
            )
        except GroupExists:
            return
        # MKSTREAM may have made an empty stream: it expires like a used one.
        await redis_call(self.redis.pexpire(key, self._retention_ms, nx=True))

    async def read(self, sku: str, consumer: str, *, new: bool) -> list[Entry]:
        """A batch of entries for ``consumer``: new ones (waiting up to the block
        time for the first), or with ``new`` false the ones it read before and
        has not acknowledged (a batch that failed). Raises :class:`StreamGone`."""
        key = self._stream(sku)
        reply = await _stream_call(
            sku,
            self.redis.xreadgroup(
                WRITERS_GROUP,
                consumer,
                {key: ">" if new else "0"},
                count=self._count,
                block=self._block_ms if new else None,
            ),
        )
        return [e for _, raw in reply or [] for e in _entries(sku, raw)]

    async def existing(self, skus: Sequence[str]) -> list[str]:
        """The skus among ``skus`` whose stream exists (one pipeline): the ones
        a purchase was queued for within the retention time."""
        pipe = self.redis.pipeline(transaction=False)
        for sku in skus:
            pipe.exists(self._stream(sku))
        found = await redis_call(pipe.execute())
        return [sku for sku, exists in zip(skus, found, strict=True) if exists]

    async def claim(self, sku: str, consumer: str) -> list[Entry]:
        """Take over entries another writer read and left unacknowledged for the
        claim idle time: that writer is presumed dead (XAUTOCLAIM). Raises
        :class:`StreamGone`."""
        key = self._stream(sku)
        claim = self.redis.xautoclaim(
            key, WRITERS_GROUP, consumer, self._claim_idle_ms, "0-0", count=self._count
        )
        reply = await _stream_call(sku, claim)
        return _entries(sku, reply[1])

    async def finish(
        self, sku: str, entries: Sequence[Entry], rejected: Mapping[str, Verdict]
    ) -> None:
        """After the commit: record the refused purchases' verdicts, then
        acknowledge and delete the entries, in one pipeline (one slot).

        Order is what matters, not atomicity: Redis runs a connection's commands
        in turn, so an entry is never acknowledged before its verdict is
        recorded, and a pipeline cut short leaves the entries pending, to be
        committed again (idempotently) by whoever claims them. No MULTI: on a
        cluster redis-py's asyncio transaction pipeline blocks the event loop
        (a thread with its own loop per command)."""
        key, rejections = (
            self._stream(sku),
            self._rejected(sku),
        )
        ids = [e.entry_id for e in entries]
        pipe = self.redis.pipeline(transaction=False)
        if rejected:
            pipe.hset(rejections, mapping={rid: v.value for rid, v in rejected.items()})
            pipe.pexpire(rejections, self._retention_ms)
        pipe.xack(key, WRITERS_GROUP, *ids)
        pipe.xdel(key, *ids)
        await redis_call(pipe.execute())

    async def remember(self, request_id: str, sku: str, user_id: str) -> None:
        """Note which sku and buyer a queued request id belongs to, for its status."""
        key = request_key(self._prefix, request_id)
        await redis_call(self.redis.set(key, encode_queued(sku, user_id), px=self._retention_ms))

    async def status(self, request_id: str, user_id: str) -> tuple[str | None, Verdict | None]:
        """(the sku the request id was queued for by ``user_id``, the database's
        refusal if any); (None, None) for a request id this buyer never queued
        (or forgotten after retention), so another buyer's reads as unknown."""
        queued = await redis_call(self.redis.get(request_key(self._prefix, request_id)))
        sku = None if queued is None else queued_by(queued, user_id)
        if sku is None:
            return None, None
        letter = await redis_call(self.redis.hget(self._rejected(sku), request_id))
        return sku, None if letter is None else Verdict(letter)

    async def queued_ids(self, sku: str) -> set[str]:
        """Request ids of the entries still in the sku's stream (not yet
        acknowledged): their reservations are queued, not stale."""
        key = self._stream(sku)
        raw = await redis_call(self.redis.xrange(key, "-", "+", count=self._max))
        return {fields["rid"] for _, fields in raw}

    async def depth(self, sku: str) -> Depth:
        """The sku's stream length and the writers' pending entries."""
        key = self._stream(sku)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(key)
        pipe.xpending(key, WRITERS_GROUP)
        try:
            length, pending = await pipe.execute(raise_on_error=False)
        except RedisError as exc:
            raise RedisUnavailable(f"redis: {type(exc).__name__}") from exc
        if isinstance(length, Exception):
            raise RedisUnavailable(f"redis: {length}")
        # No group yet (nothing read): nothing pending.
        count = 0 if isinstance(pending, Exception) else int(pending["pending"])
        return Depth(int(length), count)
