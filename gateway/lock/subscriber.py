"""One pub/sub connection per process and Redis client that wakes lock waiters.

Every waiter in the process registers here instead of opening a subscription of its
own, so 200 waiters cost one connection. A channel is subscribed while it has
waiters; an unlock message wakes one waiter (oldest first), which passes the wake on
if it leaves without having used it. Waiters still poll, bounded by the holder's TTL,
so a message lost to a reconnect only delays them.

One reader task owns the connection (connect, name it, read); one writer task sends
SUBSCRIBE/UNSUBSCRIBE so the server's state follows the waiters. For each channel we
count commands whose confirmation has not arrived: the subscription is *ready* (an
unlock published from then on will reach us) when none is outstanding and the last
command sent was SUBSCRIBE. Works over RESP2 and RESP3 (redis-py 8's default, where
these frames are push notifications).

On a Redis Cluster the connection goes to one node, each reconnect to the next one in
turn, and listens there with classic SUBSCRIBE: a release PUBLISHes on the node that
holds the lock and the cluster bus carries the message to every node. Sharded pub/sub
(SSUBSCRIBE) would keep unlocks off the bus but needs a connection per primary and
re-subscribing as slots move; releases come at most a few hundred a second (one per
flush burst per sku), which the bus carries without notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.backoff import ExponentialBackoff

from gateway.lock.backoff import pause

# Pause before reconnecting after a failure: 50 ms, doubling to 1 s; back to
# 50 ms once connected.
_RECONNECT_BACKOFF = ExponentialBackoff(cap=1.0, base=0.05)


class Connections(Protocol):
    """Where the subscriber's connection comes from: a client's pool, or cluster nodes."""

    async def get_connection(self) -> AbstractConnection: ...

    async def release(self, connection: AbstractConnection) -> None: ...


class NodeInTurn:
    """Connections to the nodes of a cluster, each one to the next node in turn, so a
    reconnect leaves a dead node behind without waiting for the slot map to change."""

    def __init__(self, cluster: RedisCluster) -> None:
        self._cluster = cluster
        self._turn = 0
        self._owners: dict[AbstractConnection, ClusterNode] = {}

    async def get_connection(self) -> AbstractConnection:
        nodes = self._cluster.get_nodes()
        if not nodes:  # the client has sent nothing yet: learn the topology first
            await self._cluster.initialize()
            nodes = self._cluster.get_nodes()
        self._turn += 1
        node = nodes[self._turn % len(nodes)]
        conn = node.acquire_connection()
        self._owners[conn] = node
        return conn

    async def release(self, connection: AbstractConnection) -> None:
        node = self._owners.pop(connection, None)
        if node is not None:
            node.release(connection)  # type: ignore[arg-type]


class Waiter:
    """One waiting acquisition: woken by an unlock message, or its own poll timeout."""

    __slots__ = ("_event", "_heard", "_owed")

    def __init__(self, heard: asyncio.Event | None) -> None:
        self._event = asyncio.Event()
        self._owed = False  # woken, and no attempt has used that wake yet
        # Set while the channel's subscription is confirmed (None: never).
        self._heard = heard

    @property
    def listening(self) -> bool:
        """Whether an unlock message published now would reach this waiter: while
        not (subscription not yet confirmed, connection lost), the caller must
        poll briskly, since the unlock it waits for may already have gone by."""
        return self._heard is not None and self._heard.is_set()

    @property
    def woken(self) -> bool:
        """Whether a wake is waiting to be picked up by :meth:`wait`."""
        return self._event.is_set()

    @property
    def owes_wake(self) -> bool:
        """Whether leaving now would swallow a wake another waiter should get."""
        return self._owed or self._event.is_set()

    def wake(self) -> None:
        """Wake the waiter (called by the subscriber)."""
        self._event.set()

    async def wait(self, pause: float) -> None:
        """Sleep until woken or ``pause`` seconds have passed."""
        if not self._event.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._event.wait()
        if self._event.is_set():
            self._event.clear()
            self._owed = True

    def use_wake(self) -> None:
        """An acquisition attempt has run since the last wake: the wake is used."""
        self._owed = False


@dataclass(eq=False, slots=True)
class _Channel:
    waiters: dict[Waiter, None] = field(default_factory=dict)  # insertion-ordered set
    subscribed: bool = False  # the last command sent was SUBSCRIBE
    outstanding: int = 0  # commands sent whose confirmation has not arrived
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class LockSubscriber:
    """The shared unlock-message subscriber of one Redis client.

    Create one per client and event loop, hand it to every :class:`RedisLock` on that
    client, and close it with :meth:`aclose` at shutdown (or use ``async with``). Its
    connection is taken from the client's pool and named ``client_name`` (default
    ``gateway-lock-sub-<pid>``) so ``CLIENT LIST`` shows it.
    """

    def __init__(
        self,
        redis: Redis | RedisCluster,
        *,
        client_name: str | None = None,
        ready_timeout: float = 1.0,
    ) -> None:
        self._pool: Connections = (
            NodeInTurn(redis) if isinstance(redis, RedisCluster) else redis.connection_pool
        )
        self.client_name = client_name or f"gateway-lock-sub-{os.getpid()}"
        self._ready_timeout = ready_timeout
        self._channels: dict[str, _Channel] = {}
        self._conn: AbstractConnection | None = None
        self._up = False
        self._dirty = asyncio.Event()
        self._io = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    @property
    def connected(self) -> bool:
        """Whether the subscriber connection is up."""
        return self._up

    @property
    def waiting(self) -> int:
        """How many waiters are registered, over all channels."""
        return sum(len(entry.waiters) for entry in self._channels.values())

    @contextlib.asynccontextmanager
    async def subscription(self, channel: str) -> AsyncIterator[Waiter]:
        """Register a waiter on ``channel`` for the duration of the block.

        Waits (at most ``ready_timeout``) until the subscription is confirmed, so an
        unlock published after the block starts reaches the waiter; when it is not
        confirmed by then (a loaded start, Redis unreachable) the waiter is not
        :attr:`Waiter.listening` and its caller polls.
        """
        if self._closed:  # nothing will wake this waiter: it polls
            yield Waiter(None)
            return
        self._start()
        entry = self._channels.get(channel)
        if entry is None:
            entry = self._channels[channel] = _Channel()
        waiter = Waiter(entry.ready)
        entry.waiters[waiter] = None
        try:
            if not entry.ready.is_set():
                self._dirty.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._ready_timeout):
                        await entry.ready.wait()
            yield waiter
        finally:
            del entry.waiters[waiter]
            if waiter.owes_wake:
                _wake_one(entry)
            if not entry.waiters:
                self._dirty.set()

    async def aclose(self) -> None:
        """Stop the tasks and give the connection back; waiters fall back to polling."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        # A cancel can be lost inside a client library: cleanup that raises while
        # the CancelledError is handled (a disconnect failing, say) replaces it
        # with an ordinary error, which the loops take for a broken connection.
        # So each loop also ends when it sees _closed, and the writer is woken
        # to see it.
        self._dirty.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._up = False
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.disconnect()
            await self._pool.release(conn)
        for entry in self._channels.values():
            for waiter in entry.waiters:
                waiter.wake()

    async def __aenter__(self) -> LockSubscriber:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._read_loop(), name="lock-subscriber-reader"),
                asyncio.create_task(self._write_loop(), name="lock-subscriber-writer"),
            ]

    async def _read_loop(self) -> None:
        failures = 0
        while not self._closed:
            try:
                conn = await self._connect()
                failures = 0
                while not self._closed:
                    reply = await conn.read_response(timeout=math.inf, push_request=True)
                    self._on_reply(reply)
            except Exception:  # unreachable or restarted: reconnect; waiters poll meanwhile
                self._up = False
                if self._closed:
                    return
                await asyncio.sleep(pause(_RECONNECT_BACKOFF, failures))
                failures += 1

    async def _connect(self) -> AbstractConnection:
        async with self._io:
            self._up = False
            reconnect = self._conn is not None
            if self._conn is not None:  # back to the pool; a cluster's next is another node
                conn, self._conn = self._conn, None
                await conn.disconnect()
                await self._pool.release(conn)
            self._conn = conn = await self._pool.get_connection()
            await conn.connect()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            await conn.send_command("CLIENT", "SETNAME", self.client_name, check_health=False)
            await conn.read_response()
            for entry in self._channels.values():
                entry.subscribed, entry.outstanding = False, 0
                entry.ready.clear()
                if reconnect:  # unlocks may have gone by while we were away
                    for waiter in entry.waiters:
                        waiter.wake()
            self._up = True
        self._dirty.set()
        return conn

    async def _write_loop(self) -> None:
        while not self._closed:
            await self._dirty.wait()
            self._dirty.clear()
            if self._closed or not self._up or self._conn is None:
                continue  # the reader sets _dirty again once it is back
            with contextlib.suppress(Exception):  # a broken connection is the reader's to mend
                async with self._io:
                    await self._sync(self._conn)

    async def _sync(self, conn: AbstractConnection) -> None:
        for name, entry in list(self._channels.items()):
            want = bool(entry.waiters)
            if want == entry.subscribed:
                if not want and entry.outstanding == 0:
                    self._drop(name, entry)
                continue
            entry.subscribed = want
            entry.outstanding += 1
            entry.ready.clear()
            command = "SUBSCRIBE" if want else "UNSUBSCRIBE"
            await conn.send_command(command, name, check_health=False)

    def _on_reply(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 2:
            return  # not pub/sub (RESP3 carries other push notifications too)
        kind, channel = _text(reply[0]), _text(reply[1])
        entry = self._channels.get(channel)
        if entry is None:
            return
        if kind == "message":
            _wake_one(entry)
        elif kind in ("subscribe", "unsubscribe"):
            entry.outstanding = max(0, entry.outstanding - 1)
            if entry.outstanding == 0 and entry.subscribed:
                entry.ready.set()
            elif entry.outstanding == 0 and not entry.waiters:
                self._drop(channel, entry)

    def _drop(self, name: str, entry: _Channel) -> None:
        if self._channels.get(name) is entry:
            del self._channels[name]


def _wake_one(entry: _Channel) -> None:
    for waiter in entry.waiters:
        if not waiter.woken:
            waiter.wake()
            return


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
