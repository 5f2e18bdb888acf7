"""The sku change feed: pub/sub announcements that drop in-process knowledge.

Scripts publish ``avail:<sku>`` when stock comes back and ``meta:<sku>`` when an
admin changed a sku (``gateway.redis.layout.Change``). Every instance listens on one
connection and tells its subscribers (the use cases' caches, registered by the
wiring) what each announcement means; after every (re)subscription they hear
that anything may have changed, since announcements may have been missed while
the connection was down.

On a Redis Cluster the scripts PUBLISH from whichever node holds the sku, and
classic pub/sub delivers a message to the subscribers of every node: one
subscription on any node hears every shard. Sharded pub/sub would need a
channel per sku (or slot) and a connection per primary for a feed of a few
messages a second. Each (re)subscription goes to the next node in turn, so a
dead node is left behind at the first retry without waiting for the slot map.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import structlog
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from gateway.lock.tasks import rest, stop_if_cancelled
from gateway.redis.connections import RedisClient
from gateway.redis.layout import Change, parse_change

log = structlog.get_logger(__name__)

RETRY_S = 0.5


class ChangeSubscriber(Protocol):
    """What the feed tells: each announcement, and that anything may have changed."""

    def stock_returned(self, sku: str) -> None:
        """Stock of ``sku`` came back (a restock, a reset, reservations given back)."""

    def sku_changed(self, sku: str) -> None:
        """An admin changed ``sku`` (or an announcement of a kind not known here)."""

    def state_dropped(self) -> None:
        """Every sku's Redis state was dropped (it came from another database)."""

    def feed_resumed(self) -> None:
        """The feed (re)subscribed: announcements may have been missed before."""


class ChangeFeed:
    """Tells its subscribers what each announcement on the channel means."""

    def __init__(
        self, redis: RedisClient, channel: str, subscribers: Sequence[ChangeSubscriber]
    ) -> None:
        self._redis = redis
        self._turn = 0  # which cluster node the next subscription goes to
        self._channel = channel
        self._subscribers = tuple(subscribers)
        self.subscribed = asyncio.Event()

    def apply(self, message: str) -> None:
        """Tell every subscriber of one announcement."""
        change, sku = parse_change(message)
        for subscriber in self._subscribers:
            if change is Change.RESET:
                subscriber.state_dropped()
            elif change is Change.AVAILABLE:
                subscriber.stock_returned(sku)
            else:  # an admin change, or one we don't know
                subscriber.sku_changed(sku)

    async def run(self) -> None:
        """Listen until cancelled, resubscribing after connection failures."""
        while True:
            try:
                await self._listen()
            except (RedisError, OSError) as exc:
                stop_if_cancelled(exc)
                self.subscribed.clear()
                log.warning("change_feed_down", cause=type(exc).__name__)
                await rest(RETRY_S)
            except Exception as exc:
                stop_if_cancelled(exc)
                # Not a connection error we know, yet the feed must outlive it: a
                # dead feed would leave restocked skus marked sold out for good.
                # (redis-py lets a write on a connection closed under it escape as
                # AttributeError or TypeError, redis/redis-py#4287.)
                self.subscribed.clear()
                log.exception("change_feed_failed")
                await rest(RETRY_S)

    async def _pubsub(self) -> PubSub:
        if not isinstance(self._redis, RedisCluster):
            return self._redis.pubsub()
        nodes = self._redis.get_nodes()
        if not nodes:  # no command has gone out yet: learn the topology first
            await self._redis.initialize()
            nodes = self._redis.get_nodes()
        self._turn += 1
        return self._redis.pubsub(node=nodes[self._turn % len(nodes)])

    async def _listen(self) -> None:
        async with await self._pubsub() as pubsub:
            await pubsub.subscribe(self._channel)
            async for message in pubsub.listen():
                if message["type"] == "subscribe":
                    # From here on nothing is missed; before, anything may have been.
                    for subscriber in self._subscribers:
                        subscriber.feed_resumed()
                    self.subscribed.set()
                elif message["type"] == "message" and isinstance(message["data"], str):
                    self.apply(message["data"])
