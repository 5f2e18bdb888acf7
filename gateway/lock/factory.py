"""Choosing the flush lock: Redis, PostgreSQL, or none, behind one protocol."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Protocol, Self

import asyncpg
from redis.asyncio import Redis

from gateway.lock.errors import LockNotOwned
from gateway.lock.metrics import LockMetrics
from gateway.lock.postgres import PgAdvisoryLock
from gateway.lock.redis_lock import RedisLock

LOCK_KINDS = ("redis", "postgres", "none")


class DistributedLock(Protocol):
    """What :class:`RedisLock`, :class:`PgAdvisoryLock` and :class:`NullLock` share."""

    name: str

    @property
    def fence(self) -> int:
        """The calling task's fencing token."""

    @property
    def lost(self) -> asyncio.Event:
        """Set when the hold is lost."""

    @property
    def held(self) -> bool:
        """Whether the lock is held through this object."""

    async def acquire(self, wait: float | None = None) -> bool:
        """Take the lock (None: no limit, 0: try once); False if the wait ran out."""

    async def release(self) -> None:
        """Give back one hold."""

    def __call__(self, wait: float | None = None) -> AbstractAsyncContextManager[Any]:
        """``async with lock(wait=...)``; raises LockTimeout when the wait runs out."""

    async def __aenter__(self) -> Any:
        """``async with lock:`` waits without limit."""

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release; LockLost if the hold was lost inside the block."""


class NullLock:
    """No lock at all: every acquisition succeeds at once, ``fence`` is 0, ``lost`` is
    never set. For a single writer, or when the conditional UPDATE alone is enough."""

    def __init__(self, name: str = "none") -> None:
        self.name = name
        self._holds = 0
        self._lost = asyncio.Event()

    @property
    def fence(self) -> int:
        """Always 0: a ``fence <= $n`` guard never rejects it."""
        return 0

    @property
    def lost(self) -> asyncio.Event:
        """Never set."""
        return self._lost

    @property
    def held(self) -> bool:
        """Whether any acquisition is outstanding."""
        return self._holds > 0

    async def acquire(self, wait: float | None = None) -> bool:
        """Succeed at once."""
        self._holds += 1
        return True

    async def release(self) -> None:
        """Count one hold given back; LockNotOwned if none is outstanding."""
        if self._holds == 0:
            raise LockNotOwned(self.name)
        self._holds -= 1

    def __call__(self, wait: float | None = None) -> Self:
        """The lock itself: there is never anything to wait for."""
        return self

    async def __aenter__(self) -> Self:
        await self.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()


def make_flush_lock(
    kind: str,
    *,
    redis: Redis | None,
    pool: asyncpg.Pool[Any] | None,
    name: str,
    lease: float,
    metrics: LockMetrics | None = None,
    max_hold: float | None = None,
) -> DistributedLock:
    """Build the flush lock of ``kind`` ("redis", "postgres" or "none").

    Raises:
        ValueError: unknown kind, or the client it needs is None.
    """
    if kind == "redis":
        if redis is None:
            raise ValueError("lock kind 'redis' needs a Redis client")
        return RedisLock(redis, name, lease=lease, max_hold=max_hold, metrics=metrics)
    if kind == "postgres":
        if pool is None:
            raise ValueError("lock kind 'postgres' needs an asyncpg pool")
        return PgAdvisoryLock(pool, name, lease=lease, max_hold=max_hold, metrics=metrics)
    if kind == "none":
        return NullLock(name)
    raise ValueError(f"unknown lock kind {kind!r}; expected one of {', '.join(LOCK_KINDS)}")
