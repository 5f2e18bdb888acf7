"""The forwarding engine of the fault proxy: connections, pumps, and the faults' effect.

A :class:`Forwarder` lives in the proxy's event loop and is only touched from
there; :class:`testkit.proxy.FaultProxy` changes its fault settings by
running commands in that loop. See the proxy's module docstring for what each
fault does to the byte streams.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field

from testkit.ports import Address

log = logging.getLogger(__name__)

CHUNK = 65536
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
class Link:
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


class Forwarder:
    """Every connection of one proxy, forwarded to ``target`` under the current faults.

    Create it inside the loop that serves the connections (it holds an
    :class:`asyncio.Event`).
    """

    def __init__(self, name: str, target: Address, stats: ProxyStats) -> None:
        self.name = name
        self.target = target
        self.stats = stats
        self.latency_s = 0.0
        self.jitter_s = 0.0
        self.blackholed = False
        self.stalled = False
        self.links: set[Link] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    def update_flow(self) -> None:
        """Hold data (stalled or black-holed) or let it go, after a setting changed."""
        if self.stalled or self.blackholed:
            self._flowing.clear()
        else:
            self._flowing.set()

    def drop(self, link: Link) -> None:
        """Abort ``link`` and forget it."""
        link.abort()
        self.links.discard(link)
        self.stats.active = len(self.links)

    async def abort_all(self) -> None:
        """Abort every connection and wait until their tasks ended."""
        tasks = [t for link in self.links for t in link.tasks]
        for link in list(self.links):
            link.abort()
        self.links.clear()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _delay(self) -> float:
        return self.latency_s + (random.uniform(0, self.jitter_s) if self.jitter_s else 0.0)

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The server's connection callback: forward one client connection to its end."""
        link = Link(client=writer)
        self.links.add(link)
        self.stats.accepted += 1
        self.stats.active = len(self.links)
        task = asyncio.current_task()
        assert task is not None
        link.tasks.append(task)
        try:
            if self.blackholed:
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
            self.drop(link)

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        while data := await reader.read(CHUNK):
            self.stats.dropped_bytes += len(data)

    async def _pump_both(
        self,
        link: Link,
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
        link: Link,
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
                if data and self.blackholed:
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
        link: Link,
        queue: asyncio.Queue[tuple[float, bytes]],
        dst: asyncio.StreamWriter,
        counter: str,
    ) -> None:
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
            self.drop(link)  # the receiving peer is gone: so is the connection
