"""Distributed locks with a watchdog and fencing tokens, on Redis or PostgreSQL.

``RedisLock`` (Redisson-style lease lock) and ``PgAdvisoryLock`` (session advisory
lock) share one interface::

    lock = RedisLock(redis, "fs:{sku1}:lock", lease=10.0, subscriber=LockSubscriber(redis))
    async with lock(wait=5.0):            # LockTimeout if not ours within 5 s
        await write(value, fence=lock.fence)   # UPDATE ... WHERE fence <= $fence

The owner is (lock object, asyncio task): the same task re-enters, other tasks are
refused. A watchdog renews the lease while the lock is held; if the lock is lost,
``lock.lost`` is set and the ``async with`` body is cancelled and leaves with
``LockLost``. A lock is an efficiency measure: correctness comes from checking the
fencing token where the data is written.

The package stands alone: its Lua scripts are package data (``lua/``), its one piece
of SQL schema is created by :func:`create_fence_sequence`, and its only dependencies
are redis-py and asyncpg. ``gateway.lock.zookeeper.ZooKeeperLock`` (same interface,
on a ``gateway.lock.zk_session.ZkSession``) needs kazoo, the optional extra
``flashsale-gateway[zookeeper]``, so it is imported from its module, not from here.
"""

from __future__ import annotations

from gateway.lock.errors import (
    LockError,
    LockLost,
    LockNotOwned,
    LockTimeout,
    closed_under_write,
    connection_errors,
)
from gateway.lock.metrics import LockMetrics, LockStats
from gateway.lock.postgres import (
    FENCE_SEQUENCE,
    PgAdvisoryLock,
    advisory_key,
    create_fence_sequence,
)
from gateway.lock.redis_lock import RedisLock, load_lock_scripts
from gateway.lock.subscriber import LockSubscriber

__all__ = [
    "FENCE_SEQUENCE",
    "LockError",
    "LockLost",
    "LockMetrics",
    "LockNotOwned",
    "LockStats",
    "LockSubscriber",
    "LockTimeout",
    "PgAdvisoryLock",
    "RedisLock",
    "advisory_key",
    "closed_under_write",
    "connection_errors",
    "create_fence_sequence",
    "load_lock_scripts",
]
