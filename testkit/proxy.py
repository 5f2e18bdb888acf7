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
import threading
from collections.abc import Awaitable, Callable
from typing import Self, TypeVar

from testkit.forwarding import Forwarder, ProxyStats
from testkit.ports import HOST, Address, free_port

T = TypeVar("T")
COMMAND_TIMEOUT_S = 5.0


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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        # Created in the proxy's loop (asyncio objects belong to one loop).
        self._forwarder: Forwarder | None = None
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
        forwarder = Forwarder(self.name, self.target, self.stats)
        self._forwarder = forwarder
        self._stop = asyncio.Event()
        server = await asyncio.start_server(forwarder.accept, HOST, self.port, reuse_address=True)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            await forwarder.abort_all()
            await server.wait_closed()

    # ------------------------------------------------------------------ commands

    def _command(self, action: Callable[[Forwarder], Awaitable[T]]) -> T:
        """Run ``action`` in the proxy's loop and wait for it (from any other thread)."""
        loop, forwarder = self._loop, self._forwarder
        if loop is None or forwarder is None or not self._ready.is_set():
            raise RuntimeError(f"{self.name}: not started")
        future = asyncio.run_coroutine_threadsafe(_call(action, forwarder), loop)
        return future.result(COMMAND_TIMEOUT_S)

    def set_latency(self, ms: float, jitter_ms: float = 0.0) -> None:
        """Delay every chunk by ``ms`` plus uniform(0, ``jitter_ms``), each direction."""

        async def apply(f: Forwarder) -> None:
            f.latency_s = ms / 1000
            f.jitter_s = jitter_ms / 1000

        self._command(apply)

    def stall(self) -> None:
        """Hold all data in both directions (connections stay open)."""

        async def apply(f: Forwarder) -> None:
            f.stalled = True
            f.update_flow()

        self._command(apply)

    def unstall(self) -> None:
        """Deliver what was held and go on forwarding."""

        async def apply(f: Forwarder) -> None:
            f.stalled = False
            f.update_flow()

        self._command(apply)

    def cut(self) -> int:
        """Abort every current connection; returns how many there were."""

        async def apply(f: Forwarder) -> int:
            links = list(f.links)
            for link in links:
                f.drop(link)
            self.stats.cut += len(links)
            return len(links)

        return self._command(apply)

    def blackhole(self, on: bool = True) -> None:
        """Swallow everything (True) or heal (False), see the module docstring."""

        async def apply(f: Forwarder) -> None:
            f.blackholed = on
            if not on:
                for link in [link for link in f.links if link.tainted]:
                    f.drop(link)
            f.update_flow()

        self._command(apply)

    def retarget(self, host: str, port: int, *, cut: bool = False) -> None:
        """Send new connections to ``host:port``; with ``cut``, abort the current ones."""

        async def apply(f: Forwarder) -> None:
            f.target = (host, port)

        self._command(apply)
        self.target = (host, port)
        if cut:
            self.cut()

    def clear(self) -> None:
        """Remove every fault (latency, stall, black hole)."""
        self.set_latency(0)
        self.blackhole(False)
        self.unstall()

    def active(self) -> int:
        """Connections open right now."""

        async def count(f: Forwarder) -> int:
            return len(f.links)

        return self._command(count)


async def _call(action: Callable[[Forwarder], Awaitable[T]], forwarder: Forwarder) -> T:
    return await action(forwarder)
