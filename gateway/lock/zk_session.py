"""One ZooKeeper session per process, bridged from kazoo's threads to asyncio.

kazoo runs its own I/O thread and delivers every result and watch on a callback
thread. Each call here starts kazoo's ``*_async`` variant and hands the result to
the event loop with ``call_soon_threadsafe``: no executor thread is parked per call,
and a thousand waiting acquisitions cost a thousand small watches, not threads.
Only ``start`` and ``stop``, which kazoo offers blocking only, run in the default
executor.

The session's state matters to the locks: ephemeral nodes live exactly as long as
the session. kazoo reports CONNECTED, SUSPENDED (connection gone, session maybe
alive) and LOST (the server expired the session, so every ephemeral node of it is
gone), and on both of the latter it fires and drops every watch. A watch here is
told whether its node is surely gone (deleted, or the session ended) or the
connection merely dropped (then nothing is known, and the watch is spent). kazoo
opens a new session by itself after a loss (``connection_retry`` never gives up).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from kazoo.client import CLOSED_STATES, KazooClient
from kazoo.exceptions import ConnectionLoss, NoNodeError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType

# kazoo errors that say "the server could not be reached", as opposed to a verdict.
UNREACHABLE: tuple[type[Exception], ...] = (ConnectionLoss, SessionExpiredError)

__all__ = ["UNREACHABLE", "ZkNode", "ZkSession", "ZkStat"]

ZkStat = Any  # kazoo.protocol.states.ZnodeStat: czxid, ephemeralOwner, ...
ZkNode = tuple[str, ZkStat]  # (path, stat) of a node just created


class ZkSession:
    """A started kazoo client and its session, usable from one event loop.

    Args:
        hosts: ``host:port,host:port`` of the ensemble.
        session_timeout: seconds the server keeps the session (and its ephemeral
            nodes) without hearing from us; the server bounds it (2 to 20 ticks by
            default). Locks on this session should use it as their lease.
    """

    def __init__(self, hosts: str, *, session_timeout: float) -> None:
        self.hosts = hosts
        self.session_timeout = session_timeout
        self._client = KazooClient(
            hosts=hosts,
            timeout=session_timeout,
            connection_retry={"max_tries": -1, "delay": 0.05, "max_delay": 1.0},
        )
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def session_id(self) -> int | None:
        """The id of the current session, None while disconnected."""
        client_id = self._client.client_id
        return None if client_id is None else int(client_id[0])

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """(session id, password) of the current session, None while disconnected: what
        another client needs to join the session (as a test does to expire it)."""
        client_id = self._client.client_id
        return None if client_id is None else (int(client_id[0]), bytes(client_id[1]))

    @property
    def connected(self) -> bool:
        """Whether the client is connected now."""
        return bool(self._client.connected)

    async def start(self, wait: float) -> None:
        """Connect, waiting at most ``wait`` seconds; raises TimeoutError otherwise."""
        self._loop = asyncio.get_running_loop()
        try:
            await self._loop.run_in_executor(None, self._client.start, wait)
        except KazooTimeoutError as exc:
            await self.stop()
            raise TimeoutError(f"zookeeper {self.hosts}: no connection in {wait}s") from exc

    async def stop(self) -> None:
        """End the session (its ephemeral nodes go with it) and the client's threads."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._client.stop)
        await loop.run_in_executor(None, self._client.close)

    async def __aenter__(self) -> ZkSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def create(self, path: str, value: bytes) -> ZkNode:
        """Create an ephemeral sequential node under ``path`` (parents made as needed)."""
        result = self._client.create_async(
            path, value, ephemeral=True, sequence=True, makepath=True, include_data=True
        )
        node: ZkNode = await self._bridge(result)
        return node

    async def children(self, path: str) -> list[str]:
        """The names of ``path``'s children ([] when ``path`` does not exist)."""
        try:
            names: list[str] = await self._bridge(self._client.get_children_async(path))
        except NoNodeError:
            return []
        return names

    async def exists(self, path: str, watch: Callable[[bool], None] | None = None) -> ZkStat | None:
        """The stat of ``path`` or None. ``watch(gone)`` is called once on the loop at
        the node's next event: ``gone`` is True when it was deleted or the session
        ended, False when it changed or the connection dropped (state unknown)."""
        kazoo_watch = None if watch is None else self._threadsafe(watch)
        return await self._bridge(self._client.exists_async(path, watch=kazoo_watch))

    async def delete(self, path: str) -> bool:
        """Delete ``path``; False when it was not there."""
        try:
            await self._bridge(self._client.delete_async(path))
        except NoNodeError:
            return False
        return True

    def _threadsafe(self, callback: Callable[[bool], None]) -> Callable[[Any], None]:
        """A kazoo watch that calls ``callback`` on our loop (dropped once the loop closed)."""
        loop = self._loop
        assert loop is not None, "ZkSession used before start()"

        def on_kazoo_thread(event: Any) -> None:
            gone = event.type == EventType.DELETED or (
                event.type == EventType.NONE and event.state in CLOSED_STATES
            )
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                loop.call_soon_threadsafe(callback, gone)

        return on_kazoo_thread

    async def _bridge(self, result: Any) -> Any:
        """Await a kazoo ``IAsyncResult`` on the loop."""
        loop = self._loop
        assert loop is not None, "ZkSession used before start()"
        future: asyncio.Future[Any] = loop.create_future()

        def resolve(done: Any) -> None:
            if future.done():  # the caller was cancelled
                return
            if done.successful():
                future.set_result(done.value)
            else:
                future.set_exception(done.exception)

        def on_kazoo_thread(done: Any) -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(resolve, done)

        result.rawlink(on_kazoo_thread)
        return await future
