"""Counting and scanning the request ids Redis knows as confirmed (a sku's done hash).

The sold-out mark carries them (``gateway.usecases.marking``): one HLEN to
see whether they changed, then HSCAN a chunk at a time, never one reply of a
million ids. Driver errors become :class:`gateway.domain.errors.RedisUnavailable`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from gateway.redis.connections import RedisClient, redis_call
from gateway.redis.layout import KeyTags, SkuKeys

# Confirmed ids asked for per HSCAN round trip.
SCAN_CHUNK = 5000


class ConfirmedScan:
    """The confirmed request ids of a sku, counted or read in chunks."""

    def __init__(self, redis: RedisClient, prefix: str, tags: KeyTags | None = None) -> None:
        self._redis = redis
        # Each sku's limit group, which tags its keys (gateway.redis.layout).
        self._tags = KeyTags() if tags is None else tags
        self._prefix = prefix

    def _keys(self, sku: str) -> SkuKeys:
        return SkuKeys.of(self._prefix, sku, self._tags.group_of(sku))

    async def count(self, sku: str) -> int:
        """How many orders Redis knows as confirmed (HLEN of the done hash)."""
        return int(await redis_call(self._redis.hlen(self._keys(sku).done)))

    async def ids(self, sku: str) -> AsyncIterator[list[str]]:
        """The confirmed request ids, a chunk (one HSCAN reply) at a time."""
        done, cursor = self._keys(sku).done, 0
        while True:
            cursor, chunk = await redis_call(self._redis.hscan(done, cursor, count=SCAN_CHUNK))
            yield list(chunk)
            if cursor == 0:
                return
