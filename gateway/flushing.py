"""The wiring a gateway and a lone queue writer share: the resources the
cleanup contexts opened (:class:`Opened`), and what both flush through
(:class:`Flushing`, built without I/O by :func:`build_flushing`), limit groups'
key tags included. ``gateway.app`` builds the rest of a gateway on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.lock import LockSubscriber
from gateway.ops.metrics import Metrics
from gateway.postgres.database import Pool
from gateway.postgres.limit_groups import LimitGroups
from gateway.postgres.orders import Orders
from gateway.redis.connections import RedisClient
from gateway.redis.layout import KeyTags
from gateway.redis.reservations import Reservations
from gateway.redis.streams import Streams
from gateway.settings import Settings
from gateway.usecases.doubt import RedisDoubt, window_for
from gateway.usecases.group_tags import GroupTags
from gateway.usecases.ports import NO_BOT_CHECK, BotCheck
from gateway.write.flusher import Flusher
from gateway.write.sku_locks import SkuLocks, sku_locks

if TYPE_CHECKING:
    from gateway.lock.zk_session import ZkSession


@dataclass(frozen=True, slots=True)
class Opened:
    """The resources the cleanup contexts before this one opened."""

    settings: Settings
    metrics: Metrics
    redis: RedisClient
    pool: Pool[Any]
    orders: Orders
    # The flush locks' session, with GATEWAY_FLUSH_LOCK=zookeeper only.
    zookeeper: ZkSession | None = None
    # The waiting rooms' bot check, with GATEWAY_BOT_CHECK_URL only.
    bot_check: BotCheck = NO_BOT_CHECK


@dataclass(frozen=True, slots=True)
class Flushing:
    """What a gateway and a lone queue writer both flush through."""

    reservations: Reservations
    lock_subscriber: LockSubscriber
    locks: SkuLocks
    flusher: Flusher
    streams: Streams
    doubt: RedisDoubt
    tags: KeyTags  # each grouped sku's limit group (its keys' tag)
    group_tags: GroupTags


def build_flushing(opened: Opened) -> Flushing:
    """The reservations, the flush locks and the flusher on ``opened``; nothing started."""
    settings, metrics, redis = opened.settings, opened.metrics, opened.redis
    tags = KeyTags()
    reservations = Reservations(redis, settings, on_noscript=metrics.scripts.reloaded, tags=tags)
    lock_subscriber = LockSubscriber(redis, client_name=f"{settings.key_prefix}-lock-sub")
    locks = sku_locks(settings, redis, opened.pool, lock_subscriber, metrics.lock, opened.zookeeper)
    doubt = RedisDoubt(window_for(settings.reconcile_interval_s))
    flusher = Flusher(
        reservations=reservations,
        orders=opened.orders,
        locks=locks,
        observer=metrics.flushes,
        on_redis_failure=doubt.failed,
    )
    streams = Streams(redis, settings, tags)
    group_tags = GroupTags(tags=tags, store=LimitGroups(opened.pool))
    return Flushing(reservations, lock_subscriber, locks, flusher, streams, doubt, tags, group_tags)
