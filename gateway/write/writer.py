"""The queue strategy's writers: commit what the sku streams hold.

Each writer is one consumer of the group ``writers`` on every sku's stream (a
task per sku, for the skus of the inventory whose stream exists; each holds a
Redis connection in its blocking read). A batch read by XREADGROUP is
committed by the flusher's guarded batch transaction (``Flusher.commit``: the
sku's lock, one ``flush_batch()`` call, then ``settle.lua``); only then are its
refusals recorded and its entries acknowledged (``Streams.finish``). A batch
that fails stays in the writer's pending entries and is tried again; entries a
dead writer left are claimed after ``GATEWAY_WRITER_CLAIM_IDLE_S``.

Every step may run again: ``flush_batch()`` answers a request id that already
has an order with that order (unique ``request_id``), refuses a second order of
a buyer (unique (sku, user)), and ``settle.lua`` settles a reservation once.
So a writer killed anywhere loses nothing and duplicates nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from typing import Protocol

import structlog
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError

from gateway.domain.errors import Unavailable
from gateway.domain.model import Verdict
from gateway.lock import LockError
from gateway.lock.backoff import pause
from gateway.lock.tasks import rest
from gateway.postgres.inventory import Inventory
from gateway.redis.streams import Depth, Entry, StreamGone, Streams
from gateway.write.flusher import Flusher

log = structlog.get_logger(__name__)

# How often a writer looks for new skus and samples its streams' depth.
DISCOVER_S = 1.0
# Pause after a failed batch: 50 ms, doubling to 2 s; back to 50 ms after one commits.
RETRY_BACKOFF = ExponentialBackoff(cap=2.0, base=0.05)


class WriterObserver(Protocol):
    """What the metrics want to know of the writers (see gateway.ops.metrics)."""

    def writer_batch(self, size: int, *, failed: bool) -> None: ...
    def stream_reclaimed(self, count: int) -> None: ...
    def stream_depth(self, sku: str, length: int, pending: int) -> None: ...


class QueueWriter:
    """One consumer of the writers' group, committing every sku's stream."""

    def __init__(
        self,
        *,
        streams: Streams,
        flusher: Flusher,
        inventory: Inventory,
        claim_every_s: float,
        observer: WriterObserver | None = None,
    ) -> None:
        self._streams = streams
        self._flusher = flusher
        self._inventory = inventory
        self._claim_every_s = claim_every_s
        self._observer = observer
        # Unique per process and start: a restarted writer claims its former
        # self's entries like any dead writer's.
        self.consumer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        """Write every sku's stream until cancelled, starting skus as they appear."""
        try:
            while True:
                try:
                    await self._discover()
                except (Unavailable, LockError, RedisError) as exc:
                    log.warning("writer_discovery_failed", cause=repr(exc))
                await rest(DISCOVER_S)
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop every sku's task. What is unacknowledged stays pending and is
        claimed by another writer: committing it again changes nothing."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _discover(self) -> None:
        # Only active skus with a stream: a blocking read holds a Redis connection.
        for sku in await self._streams.existing(await self._inventory.active_skus()):
            task = self._tasks.get(sku)
            if task is None or task.done():
                self._tasks[sku] = asyncio.create_task(self._write(sku), name=f"writer-{sku}")
            if self._observer is not None:
                depth: Depth = await self._streams.depth(sku)
                self._observer.stream_depth(sku, depth.length, depth.pending)

    async def _write(self, sku: str) -> None:
        """The sku's loop: retry own failed entries, claim a dead writer's, read new
        ones; it ends when the stream is gone (discovery starts it again)."""
        loop = asyncio.get_running_loop()
        failures, claim_at, retry = 0, 0.0, True
        while True:
            try:
                if retry:
                    await self._streams.ensure_group(sku)
                    entries = await self._streams.read(sku, self.consumer, new=False)
                else:
                    entries = []
                if not entries and loop.time() >= claim_at:
                    claim_at = loop.time() + self._claim_every_s
                    entries = await self._streams.claim(sku, self.consumer)
                    if entries and self._observer is not None:
                        self._observer.stream_reclaimed(len(entries))
                if not entries:
                    entries = await self._streams.read(sku, self.consumer, new=True)
                if entries:
                    await self._apply(sku, entries)
                else:
                    # Nothing queued: let other instances have the sku's lock.
                    await self._flusher.emptied(sku)
                retry, failures = False, 0
            except StreamGone:
                await self._flusher.emptied(sku)
                return
            except Exception as exc:
                # The batch stays pending for this writer (or, if it dies, another).
                if self._observer is not None:
                    self._observer.writer_batch(0, failed=True)
                expected = isinstance(exc, Unavailable | LockError | RedisError)
                log.warning(
                    "writer_batch_failed",
                    sku=sku,
                    cause=repr(exc),
                    exc_info=None if expected else exc,
                )
                retry = True
                await rest(pause(RETRY_BACKOFF, failures))
                failures += 1

    async def _apply(self, sku: str, entries: list[Entry]) -> None:
        """Commit a batch, then record its refusals and acknowledge it."""
        decision = await self._flusher.commit(sku, [e.purchase for e in entries])
        rejected = {
            rid: d.verdict
            for rid, d in decision.decisions.items()
            if d.verdict is not Verdict.CONFIRMED
        }
        await self._streams.finish(sku, entries, rejected)
        if self._observer is not None:
            self._observer.writer_batch(len(entries), failed=False)
