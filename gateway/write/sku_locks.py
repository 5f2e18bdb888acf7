"""The per-sku flush locks: which family (``GATEWAY_FLUSH_LOCK``), one object per sku.

The flusher, the admin changes and the reconciler each take a sku's lock
through :class:`SkuLocks`, so they agree on the lock and on how long to wait.
With ``GATEWAY_FLUSH_LOCK=none`` there is no lock: the database's row lock and
stock guard alone keep writers honest. ``zookeeper`` needs the optional extra
``flashsale-gateway[zookeeper]`` (kazoo), imported only when chosen. Every lock
reports its holds to the sku's :class:`LeaseRule` as well as to the metrics.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

import asyncpg

from gateway.lock import LockMetrics, LockSubscriber, PgAdvisoryLock, RedisLock
from gateway.redis.connections import RedisClient
from gateway.redis.layout import lock_key
from gateway.settings import LockFamily, Settings
from gateway.write.lease_rule import LeaseRule

if TYPE_CHECKING:
    from gateway.lock.zk_session import ZkSession


class FlushLock(Protocol):
    """The lock a flush holds while it writes its sku's row (see gateway.lock)."""

    @property
    def fence(self) -> int:
        """The fencing token of the current holding."""

    @property
    def lost(self) -> asyncio.Event:
        """Set when the calling task's hold was lost."""

    async def acquire(self, wait: float | None = None) -> bool:
        """Take the lock for the calling task; False when the wait ran out."""

    async def release(self) -> None:
        """Release the calling task's hold."""

    def abandon(self) -> None:
        """Forget the calling task's hold when its release could not get through."""

    def __call__(self, wait: float | None = None) -> AbstractAsyncContextManager[Any]:
        """Hold the lock for an ``async with`` block, waiting at most ``wait`` seconds."""


class SkuLocks:
    """One flush lock object per sku, of one family, or none at all."""

    def __init__(self, family: LockFamily, wait_s: float, make: _Maker | None) -> None:
        self.family = family
        # How long a flush, an admin change or the reconciler waits for the lock.
        self.wait_s = wait_s
        self._make = make
        self._locks: dict[str, FlushLock] = {}

    @property
    def enabled(self) -> bool:
        """Whether writers take a lock at all (``GATEWAY_FLUSH_LOCK`` is not ``none``)."""
        return self._make is not None

    def get(self, sku: str) -> FlushLock | None:
        """The sku's lock (the same object every time), or None without locks."""
        if self._make is None:
            return None
        lock = self._locks.get(sku)
        if lock is None:
            lock = self._locks[sku] = self._make(sku)
        return lock

    def held(self, sku: str) -> AbstractAsyncContextManager[Any]:
        """``async with locks.held(sku):`` holds the sku's lock (nothing without locks)."""
        lock = self.get(sku)
        return nullcontext() if lock is None else lock(wait=self.wait_s)


class _Maker(Protocol):
    def __call__(self, sku: str) -> FlushLock: ...


def sku_locks(
    settings: Settings,
    redis: RedisClient,
    pool: asyncpg.Pool[Any],
    subscriber: LockSubscriber,
    metrics: LockMetrics,
    zookeeper: ZkSession | None = None,
) -> SkuLocks:
    """The flush locks ``settings`` ask for, on this Redis client, PostgreSQL pool or
    ZooKeeper session (which ``zookeeper`` must be given)."""
    prefix, lease = settings.key_prefix, settings.lock_lease_s
    # A sku's fence counter goes with the rest of its sale's keys.
    retention = settings.sale_retention_s
    rule = LeaseRule(lease)

    def redis_lock(sku: str) -> FlushLock:
        name, watched = lock_key(prefix, sku), rule.metrics_for(sku, metrics)
        return RedisLock(
            redis, name, lease=lease, metrics=watched, fence_ttl=retention, subscriber=subscriber
        )

    def pg_lock(sku: str) -> FlushLock:
        watched = rule.metrics_for(sku, metrics)
        return PgAdvisoryLock(pool, lock_key(prefix, sku), lease=lease, metrics=watched)

    def zk_lock(sku: str) -> FlushLock:
        from gateway.lock.zookeeper import ZooKeeperLock  # the optional extra

        assert zookeeper is not None, "GATEWAY_FLUSH_LOCK=zookeeper without a session"
        watched = rule.metrics_for(sku, metrics)
        return ZooKeeperLock(zookeeper, lock_key(prefix, sku), lease=lease, metrics=watched)

    makers: dict[LockFamily, _Maker | None] = {
        LockFamily.REDIS: redis_lock,
        LockFamily.POSTGRES: pg_lock,
        LockFamily.ZOOKEEPER: zk_lock,
        LockFamily.NONE: None,
    }
    return SkuLocks(settings.flush_lock, lease, makers[settings.flush_lock])
