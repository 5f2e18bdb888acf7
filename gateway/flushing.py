"""The wiring a gateway and a lone queue writer share: the resources the
cleanup contexts opened (:class:`Opened`), and what both flush through
(:class:`Flushing`, built without I/O by :func:`build_flushing`), limit groups'
key tags included. ``gateway.app`` builds the rest of a gateway on them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.domain.events import SinkName
from gateway.lock import LockSubscriber
from gateway.ops.metrics import Metrics
from gateway.postgres.database import Pool
from gateway.postgres.limit_groups import LimitGroups
from gateway.postgres.orders import Orders
from gateway.postgres.outbox import Outbox
from gateway.redis.connections import RedisClient
from gateway.redis.event_stream import EventStream
from gateway.redis.layout import KeyTags
from gateway.redis.reservations import Reservations
from gateway.redis.streams import Streams
from gateway.settings import Settings
from gateway.usecases.doubt import RedisDoubt, window_for
from gateway.usecases.group_tags import GroupTags
from gateway.usecases.handoff import HandOff
from gateway.usecases.ports import NO_BOT_CHECK, BotCheck
from gateway.write.flusher import NO_HANDOFF, Flusher
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
    # Flushes' first events to the stream (GATEWAY_EVENTS_HANDOFF); None: the
    # relay delivers them.
    handoff: HandOff | None


def build_flushing(opened: Opened) -> Flushing:
    """The reservations, the flush locks and the flusher on ``opened``; nothing started."""
    settings, metrics, redis = opened.settings, opened.metrics, opened.redis
    tags = KeyTags()
    reservations = Reservations(redis, settings, on_noscript=metrics.scripts.reloaded, tags=tags)
    lock_subscriber = LockSubscriber(redis, client_name=f"{settings.key_prefix}-lock-sub")
    locks = sku_locks(settings, redis, opened.pool, lock_subscriber, metrics.lock, opened.zookeeper)
    doubt = RedisDoubt(window_for(settings.reconcile_interval_s))
    handoff = _handoff(opened)
    flusher = Flusher(
        reservations=reservations,
        orders=opened.orders,
        locks=locks,
        observer=metrics.flushes,
        on_redis_failure=doubt.failed,
        handoff=NO_HANDOFF if handoff is None else handoff,
    )
    streams = Streams(redis, settings, tags)
    group_tags = GroupTags(tags=tags, store=LimitGroups(opened.pool))
    return Flushing(
        reservations, lock_subscriber, locks, flusher, streams, doubt, tags, group_tags, handoff
    )


def event_stream(settings: Settings, redis: RedisClient, webhook: Outbox | None) -> EventStream:
    """The stream sink; with ``webhook`` (the outbox, a webhook configured) never
    trimmed past an event still owed to the webhook."""
    return EventStream(
        redis,
        settings.events_stream,
        max_len=settings.events_stream_max_len,
        max_age_s=settings.events_stream_max_age_s,
        webhook_owed=None
        if webhook is None
        else functools.partial(webhook.oldest_owed, SinkName.WEBHOOK),
        replicas=settings.stream_replicas,
    )


def _handoff(opened: Opened) -> HandOff | None:
    """The flushes' hand-off of first events to the stream: with the relay
    (which registers the stream and delivers what a hand-off could not) and
    GATEWAY_EVENTS_HANDOFF, on one Redis (a cluster's stream takes events as
    fields, through the relay's script)."""
    settings = opened.settings
    if not (settings.events_relay and settings.events_handoff):
        return None
    outbox = Outbox(opened.pool)
    stream = event_stream(settings, opened.redis, outbox if settings.webhook_url else None)
    if not stream.packed:
        return None
    return HandOff(sink=stream.name, out=stream, records=outbox, observer=opened.metrics.events)
