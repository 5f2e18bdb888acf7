"""The sku change feed: pub/sub announcements that drop in-process knowledge.

Scripts publish ``avail:<sku>`` when stock comes back and ``meta:<sku>`` when an
admin changed a sku (``gateway.layout.Change``). Every instance listens on one
connection. After every (re)subscription all marks are dropped, since
announcements may have been missed while the connection was down.
"""

from __future__ import annotations

import asyncio

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.catalog import Catalog
from gateway.layout import Change, parse_change
from gateway.soldout import SoldOut

log = structlog.get_logger(__name__)

RETRY_S = 0.5


class ChangeFeed:
    """Applies announcements on the channel to the sold-out marks and catalog."""

    def __init__(self, redis: Redis, channel: str, soldout: SoldOut, catalog: Catalog) -> None:
        self._redis = redis
        self._channel = channel
        self._soldout = soldout
        self._catalog = catalog
        self.subscribed = asyncio.Event()

    def apply(self, message: str) -> None:
        """Apply one announcement."""
        change, sku = parse_change(message)
        if change is Change.RESET:
            self._soldout.clear_all(filters=True)
            self._catalog.forget_all()
            return
        self._soldout.clear(sku)
        if change is not Change.AVAILABLE:  # an admin change, or one we don't know
            self._catalog.forget(sku)

    async def run(self) -> None:
        """Listen until cancelled, resubscribing after connection failures."""
        while True:
            try:
                await self._listen()
            except (RedisError, OSError) as exc:
                self.subscribed.clear()
                log.warning("change_feed_down", cause=type(exc).__name__)
                await asyncio.sleep(RETRY_S)

    async def _listen(self) -> None:
        async with self._redis.pubsub() as pubsub:
            await pubsub.subscribe(self._channel)
            async for message in pubsub.listen():
                if message["type"] == "subscribe":
                    # From here on nothing is missed; before, anything may have been.
                    self._soldout.clear_all()
                    self._catalog.forget_all()
                    self.subscribed.set()
                elif message["type"] == "message" and isinstance(message["data"], str):
                    self.apply(message["data"])
