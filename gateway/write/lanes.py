"""A host's lanes: one worker of a host flushes each sku for all of them.

``GATEWAY_WORKERS`` processes share a port and the kernel spreads connections
over them, so every worker reserves purchases of every sku. Flushed where they
were reserved, a hot sku's batches split W ways and the workers take turns on
its flush lock: two workers on one core sold less than one, at a far longer
p99 (docs/scaling.md). Here each sku has one owner among the host's workers, by a
hash of its name. A worker passes the purchases it reserved for another's sku
over a Unix socket to the owner's batcher, so its batches form whole there, and
hands the owner's answer to its buyer. The fleet lock, the fencing token and
the stock guard are unchanged: lanes only choose which process of a host
flushes a sku, as the balancer chooses the host (``deploy/haproxy.cfg``).

Frames are orjson lines of named fields (gateway.write.frames): a purchase,
and its answer, a result or an error. Frames written in one turn of the loop
go out in one write.

A worker links to every other as soon as each listens, before any purchase
(workers start in any order); ``flashsale_lane_links`` counts the open links,
W * (W - 1) for a linked host of W workers. When the owner cannot take a
purchase it is flushed here, as without lanes: the owner is not listening yet
or any more (its link is retried at most every :data:`RECONNECT_S`), or it is
draining (it answers ShuttingDown before adding to its backlog). A link lost while
purchases were passed on answers them :class:`OutcomeUnknown`, and so does a
purchase the owner added to its backlog and then gave up in a drain out of time: the owner
may have committed them, so their reservations stay in the ledger for the
reconciler, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, cast

import structlog

from gateway.domain.errors import GatewayError, OutcomeUnknown, ShuttingDown, Unavailable
from gateway.domain.model import Purchase, Result
from gateway.write import frames
from gateway.write.batcher import Batcher

log = structlog.get_logger(__name__)

# Longest a worker flushes another's skus itself after failing to reach it:
# a failed connect to a Unix socket costs one system call, so it is retried soon.
RECONNECT_S = 0.1


class LaneObserver(Protocol):
    """What the metrics want to know of the lanes (see gateway.ops.metrics)."""

    def passed(self, count: int) -> None: ...
    def kept(self, reason: str) -> None: ...
    def linked(self, change: int) -> None: ...


def owner_of(sku: str, count: int) -> int:
    """The index of the worker that flushes ``sku`` among ``count``: the same in
    every worker of the host (crc32, not the salted ``hash``)."""
    return zlib.crc32(sku.encode()) % count


def socket_path(directory: str, index: int) -> str:
    """Where worker ``index`` of the host listens for purchases passed to it."""
    return str(Path(directory) / f"lane-{index}.sock")


class HostLanes:
    """Submits each reserved purchase to the batcher of its sku's owner.

    In the role :class:`Batcher` plays without lanes (``submit``, ``full``,
    ``closing``), and the owner's end of every other worker's link (``start``).
    """

    def __init__(
        self,
        batcher: Batcher,
        *,
        directory: str,
        index: int,
        count: int,
        backlog_max: int,
        observer: LaneObserver,
    ) -> None:
        self._batcher = batcher
        self._directory = directory
        self._index = index
        self._count = count
        self._backlog_max = backlog_max
        self._observer = observer
        self._links: dict[int, _Link] = {}
        self._connecting: dict[int, asyncio.Task[None]] = {}
        self._retry_at: dict[int, float] = {}
        self._server: asyncio.AbstractServer | None = None
        self._serving: set[_Serving] = set()
        self._linking: asyncio.Task[None] | None = None
        self._linked = False

    @property
    def closing(self) -> bool:
        """Whether this worker is draining."""
        return self._batcher.closing

    @property
    def linked(self) -> bool:
        """Whether this worker has been linked to every other worker of its host:
        until then the host is not up as a whole (``/readyz`` says so)."""
        return self._linked

    @property
    def full(self) -> bool:
        """Whether a new purchase should be shed: this worker's backlog and what
        it passed on and awaits count together against the bound."""
        passed = sum(len(link.pending) for link in self._links.values())
        return self._batcher.full or self._batcher.backlog + passed >= self._backlog_max

    async def start(self) -> None:
        """Listen for the purchases the host's other workers pass on."""
        path = socket_path(self._directory, self._index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a socket file left by a worker that died
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: _Serving(self._batcher, self._serving, self._observer), path
        )
        self._linking = asyncio.create_task(
            self._link_all(), name="lane-link", context=contextvars.Context()
        )

    async def _link_all(self) -> None:
        """Link to every other worker as soon as it listens (workers start in
        any order), so that a sale's first purchases are passed too. A link
        lost later is opened again by the next purchase that needs it."""
        while True:
            missing = [i for i in range(self._count) if i != self._index and i not in self._links]
            if not missing:
                self._linked = True
                return
            for owner in missing:
                self._reconnect(owner, quiet=True)
            await asyncio.sleep(RECONNECT_S)

    async def close(self) -> None:
        """Stop listening and drop every link (after the batcher has drained)."""
        if self._linking is not None:
            self._linking.cancel()
        for task in self._connecting.values():
            task.cancel()
        for link in list(self._links.values()):
            link.close()
        for serving in list(self._serving):
            serving.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def submit(self, purchase: Purchase) -> Result:
        """Flush ``purchase`` in its sku's lane and return its result (see
        :meth:`Batcher.submit`): here if this worker owns the sku or cannot reach
        its owner, else by the owner."""
        owner = owner_of(purchase.sku, self._count)
        if owner != self._index:
            link = self._link(owner)
            if link is not None:
                result = await link.pass_on(purchase)
                if result is not None:
                    return result
                self._observer.kept("draining")
        return await self._batcher.submit(purchase)

    def _link(self, owner: int) -> _Link | None:
        """The open link to ``owner``; None while it is down, after starting a
        reconnection unless one runs or failed within RECONNECT_S."""
        link = self._links.get(owner)
        if link is not None:
            return link
        self._reconnect(owner, quiet=False)
        self._observer.kept("unreachable")
        return None

    def _reconnect(self, owner: int, *, quiet: bool) -> None:
        """Start connecting to ``owner`` unless that runs or failed within RECONNECT_S."""
        now = asyncio.get_running_loop().time()
        if owner not in self._connecting and now >= self._retry_at.get(owner, 0.0):
            self._retry_at[owner] = now + RECONNECT_S
            # A fresh context: the link outlives the request that opened it, and
            # its log lines must not carry that request's bindings.
            self._connecting[owner] = asyncio.create_task(
                self._connect(owner, quiet=quiet),
                name=f"lane-connect:{owner}",
                context=contextvars.Context(),
            )

    async def _connect(self, owner: int, *, quiet: bool) -> None:
        loop = asyncio.get_running_loop()
        path = socket_path(self._directory, owner)
        try:
            await loop.create_unix_connection(
                lambda: _Link(owner, self._links, self._observer), path
            )
        except OSError as exc:
            # Quiet while the workers start: the owner may not listen yet.
            if not quiet:
                log.info("lane_unreachable", owner=owner, cause=repr(exc))
        finally:
            del self._connecting[owner]


class _Writes:
    """Frames gathered in one turn of the loop, written together at its end."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._frames: list[bytes] = []

    def send(self, frame: bytes) -> None:
        if not self._frames:
            asyncio.get_running_loop().call_soon(self.write)
        self._frames.append(frame)

    def write(self) -> None:
        """Write the frames gathered so far (at the end of the turn, or at once
        before the transport closes: a drain's last answers must not be lost)."""
        frames, self._frames = self._frames, []
        if frames and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(frames))


class _Lines(asyncio.Protocol):
    """A protocol of newline-ended orjson frames."""

    def __init__(self) -> None:
        self._out = _Writes()
        self._rest = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport's subclasses.
        self._out.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        *lines, self._rest = (self._rest + data).split(b"\n")
        for line in lines:
            self.frame_received(frames.read(line))

    def frame_received(self, frame: frames.Frame) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._out.write()
        if self._out.transport is not None:
            self._out.transport.close()


class _Link(_Lines):
    """A worker's link to the owner of some skus: passes purchases, awaits answers."""

    def __init__(self, owner: int, links: dict[int, _Link], observer: LaneObserver) -> None:
        super().__init__()
        self._owner = owner
        self._links = links
        self._observer = observer
        self._seq = 0
        self.pending: dict[int, asyncio.Future[Result | None]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._links[self._owner] = self
        self._observer.linked(1)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._links.get(self._owner) is self:
            del self._links[self._owner]
            self._observer.linked(-1)
        if self.pending:
            log.warning("lane_lost", owner=self._owner, passed=len(self.pending), cause=repr(exc))
        for future in self.pending.values():
            if not future.done():
                future.set_exception(OutcomeUnknown(f"lost the lane to worker {self._owner}"))
        self.pending.clear()

    async def pass_on(self, purchase: Purchase) -> Result | None:
        """The owner's result for ``purchase``; None when it did not take it."""
        self._seq += 1
        seq = self._seq
        future: asyncio.Future[Result | None] = asyncio.get_running_loop().create_future()
        self.pending[seq] = future
        self._out.send(frames.purchase_frame(seq, purchase))
        try:
            return await future
        finally:
            # Cancelled (its buyer went away): the owner flushes it regardless,
            # and its answer finds nobody.
            self.pending.pop(seq, None)

    def frame_received(self, frame: frames.Frame) -> None:
        future = self.pending.pop(frame[0], None)
        if future is None or future.done():
            return
        if frames.is_result(frame):
            future.set_result(frames.result_of(frame))
        elif frame[1] == ShuttingDown.__name__:
            future.set_result(None)
        else:
            future.set_exception(frames.error_of(frame))


class _Serving(_Lines):
    """The owner's end of one worker's link: adds purchases to the backlog, answers each."""

    def __init__(self, batcher: Batcher, serving: set[_Serving], observer: LaneObserver) -> None:
        super().__init__()
        self._batcher = batcher
        self._serving = serving
        self._observer = observer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._serving.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        # What joined the backlog is flushed and settled all the same; its answers
        # find no link (the worker that passed them answered 503 already).
        self._out.transport = None
        self._serving.discard(self)

    def frame_received(self, frame: frames.Frame) -> None:
        seq = frame[0]
        try:
            future = self._batcher.add(frames.purchase_of(frame))
        except ShuttingDown as exc:
            self._out.send(_error_frame(seq, exc))
            return
        self._observer.passed(1)
        future.add_done_callback(self._answerer(seq))

    def _answerer(self, seq: int) -> Callable[[asyncio.Future[Result]], None]:
        def answer(future: asyncio.Future[Result]) -> None:
            exc = future.exception()
            if isinstance(exc, ShuttingDown):
                # In the backlog, then given up by a drain out of time, perhaps while
                # its flush ran: not "not taken" (which the passer would flush
                # again), but an outcome only the reconciler can tell.
                exc = OutcomeUnknown("the owner stopped before its flush ended")
            if exc is not None:
                self._out.send(_error_frame(seq, exc))
                return
            self._out.send(frames.result_frame(seq, future.result()))

        return answer


def _error_frame(seq: int, exc: BaseException) -> bytes:
    if not isinstance(exc, GatewayError):
        # The flusher answers with gateway errors; anything else is a bug there,
        # and the buyer gets what the flusher gives an unexpected failure.
        exc = Unavailable("error")
    return frames.error_frame(seq, exc)
