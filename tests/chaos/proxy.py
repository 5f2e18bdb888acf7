"""A TCP fault proxy: latency, stalls, cuts and black holes between a client and a server.

``FaultProxy`` listens on a loopback port and forwards every connection to a
target. It runs its own event loop in a daemon thread, so it keeps forwarding
while the test's loop is busy and serves gateway subprocesses just as well as
in-process clients. Commands are ordinary methods, callable from any thread;
each returns once the proxy's loop has applied it.

Faults:

* ``set_latency(ms, jitter_ms)``: every chunk, in each direction, is delivered
  ``ms`` (+ up to ``jitter_ms``) after it arrived: a round trip costs twice.
  Order within a connection is kept: a chunk is never due before the one
  ahead of it.
* ``stall()`` / ``unstall()``: data is read and held, nothing is delivered,
  no connection is closed; ``unstall`` delivers everything held, in order.
* ``cut()``: every current connection is aborted on both sides.
* ``blackhole(True)``: new connections are accepted but never reach the
  target; data from every connection is read and dropped. ``blackhole(False)``
  closes the connections that lost data (their byte streams have holes, so
  the honest thing is what a real timeout would do: drop them) and lets the
  others go on.
* ``retarget(host, port)``: new connections go to another server.
* ``clear()``: no latency, no stall, no black hole.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Self, TypeVar

from tests.chaos.servers import HOST, Address, free_port

log = logging.getLogger(__name__)

T = TypeVar("T")
CHUNK = 65536
COMMAND_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 2.0
_EOF = b""


@dataclass
class ProxyStats:
    """Counters since the proxy started."""

    accepted: int = 0
    active: int = 0
    cut: int = 0
    upstream_failures: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    dropped_bytes: int = 0


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client's streams, the target's, and the pumps."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # Bytes were dropped (black hole): the stream is corrupt, close it on heal.
    tainted: bool = False
    closed: bool = False

    def abort(self) -> None:
        """Close both sides at once, without flushing (the peers see a reset or EOF)."""
        self.closed = True
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


class FaultProxy:
    """Forwards ``listen_port`` to ``target_host:target_port``, with faults on command."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_port: int | None = None,
        *,
        name: str = "proxy",
    ) -> None:
        self.name = name
        self.port = listen_port or free_port()
        self.target: Address = (target_host, target_port)
        self.stats = ProxyStats()
        self._latency_s = 0.0
        self._jitter_s = 0.0
        self._blackholed = False
        self._stalled = False
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        # Created in the proxy's loop (asyncio objects belong to one loop).
        self._flowing: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None

    @property
    def address(self) -> Address:
        """(host, port) clients connect to."""
        return (HOST, self.port)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Start the proxy thread; returns once the port accepts connections."""
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        self._thread = threading.Thread(target=self._run, name=f"fault-{self.name}", daemon=True)
        self._thread.start()
        if not self._ready.wait(COMMAND_TIMEOUT_S):
            raise TimeoutError(f"{self.name}: did not start")
        if self._startup_error is not None:
            raise self._startup_error
        return self

    def stop(self) -> None:
        """Close the listener and every connection; join the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        stop = self._stop
        if stop is not None:
            loop.call_soon_threadsafe(stop.set)
        thread.join(COMMAND_TIMEOUT_S * 2)
        if thread.is_alive():
            raise RuntimeError(f"{self.name}: proxy thread did not stop")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start() if it happened there
            self._startup_error = exc
            self._ready.set()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._accept, HOST, self.port, reuse_address=True)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            await self._abort_all()
            await server.wait_closed()

    async def _abort_all(self) -> None:
        tasks = [t for link in self._links for t in link.tasks]
        for link in list(self._links):
            link.abort()
        self._links.clear()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ commands

    def _command(self, action: Callable[[], Awaitable[T]]) -> T:
        """Run ``action`` in the proxy's loop and wait for it (from any other thread)."""
        loop = self._loop
        if loop is None or not self._ready.is_set():
            raise RuntimeError(f"{self.name}: not started")
        future = asyncio.run_coroutine_threadsafe(_call(action), loop)
        return future.result(COMMAND_TIMEOUT_S)

    def set_latency(self, ms: float, jitter_ms: float = 0.0) -> None:
        """Delay every chunk by ``ms`` plus uniform(0, ``jitter_ms``), each direction."""

        async def apply() -> None:
            self._latency_s = ms / 1000
            self._jitter_s = jitter_ms / 1000

        self._command(apply)

    def stall(self) -> None:
        """Hold all data in both directions (connections stay open)."""

        async def apply() -> None:
            self._stalled = True
            self._update_flow()

        self._command(apply)

    def unstall(self) -> None:
        """Deliver what was held and go on forwarding."""

        async def apply() -> None:
            self._stalled = False
            self._update_flow()

        self._command(apply)

    def cut(self) -> int:
        """Abort every current connection; returns how many there were."""

        async def apply() -> int:
            links = list(self._links)
            for link in links:
                self._drop(link)
            self.stats.cut += len(links)
            return len(links)

        return self._command(apply)

    def blackhole(self, on: bool = True) -> None:
        """Swallow everything (True) or heal (False), see the module docstring."""

        async def apply() -> None:
            self._blackholed = on
            if not on:
                for link in [link for link in self._links if link.tainted]:
                    self._drop(link)
            self._update_flow()

        self._command(apply)

    def retarget(self, host: str, port: int, *, cut: bool = False) -> None:
        """Send new connections to ``host:port``; with ``cut``, abort the current ones."""

        async def apply() -> None:
            self.target = (host, port)

        self._command(apply)
        if cut:
            self.cut()

    def clear(self) -> None:
        """Remove every fault (latency, stall, black hole)."""
        self.set_latency(0)
        self.blackhole(False)
        self.unstall()

    def active(self) -> int:
        """Connections open right now."""

        async def count() -> int:
            return len(self._links)

        return self._command(count)

    # ------------------------------------------------------------------ forwarding

    def _update_flow(self) -> None:
        assert self._flowing is not None
        if self._stalled or self._blackholed:
            self._flowing.clear()
        else:
            self._flowing.set()

    def _drop(self, link: _Link) -> None:
        link.abort()
        self._links.discard(link)
        self.stats.active = len(self._links)

    def _delay(self) -> float:
        return self._latency_s + (random.uniform(0, self._jitter_s) if self._jitter_s else 0.0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(client=writer)
        self._links.add(link)
        self.stats.accepted += 1
        self.stats.active = len(self._links)
        task = asyncio.current_task()
        assert task is not None
        link.tasks.append(task)
        try:
            if self._blackholed:
                # Never reaches the target; whatever it sends is dropped.
                link.tainted = True
                await self._swallow(reader)
                return
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    up_reader, up_writer = await asyncio.open_connection(*self.target)
            except (OSError, TimeoutError):
                self.stats.upstream_failures += 1
                return
            link.upstream = up_writer
            if link.closed:  # cut while connecting
                up_writer.transport.abort()
                return
            await self._pump_both(link, reader, up_reader, up_writer)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("%s: connection failed", self.name)
        finally:
            self._drop(link)

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        while data := await reader.read(CHUNK):
            self.stats.dropped_bytes += len(data)

    async def _pump_both(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        up = asyncio.create_task(self._pump(link, reader, up_writer, "bytes_up"))
        down = asyncio.create_task(self._pump(link, up_reader, link.client, "bytes_down"))
        link.tasks += [up, down]
        # Either side closing ends the connection (after its data went through).
        await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)

    async def _pump(
        self,
        link: _Link,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        counter: str,
    ) -> None:
        """One direction: a reader stamps each chunk with its due time, a writer delivers."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        writer = asyncio.create_task(self._deliver(link, queue, dst, counter))
        link.tasks.append(writer)
        loop = asyncio.get_running_loop()
        last_due = 0.0
        try:
            while True:
                data = await src.read(CHUNK)
                if data and self._blackholed:
                    link.tainted = True
                    self.stats.dropped_bytes += len(data)
                    continue
                # Never due before the chunk ahead: latency must not reorder bytes.
                last_due = max(loop.time() + self._delay(), last_due)
                queue.put_nowait((last_due, data))
                if not data:
                    break
            await writer
        except OSError:
            pass  # a reset by either peer ends the connection like an EOF
        finally:
            writer.cancel()

    async def _deliver(
        self,
        link: _Link,
        queue: asyncio.Queue[tuple[float, bytes]],
        dst: asyncio.StreamWriter,
        counter: str,
    ) -> None:
        assert self._flowing is not None
        loop = asyncio.get_running_loop()
        try:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                # Cleared while stalled or black-holed: data waits here, in order.
                await self._flowing.wait()
                if data == _EOF:
                    return
                dst.write(data)
                setattr(self.stats, counter, getattr(self.stats, counter) + len(data))
                await dst.drain()
        except OSError:
            self._drop(link)  # the receiving peer is gone: so is the connection


async def _call(action: Callable[[], Awaitable[T]]) -> T:
    return await action()
