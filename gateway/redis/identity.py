"""The stamp naming the database the Redis state came from (``<prefix>:db``).

Redis state is only true of the database its orders were committed in. State
stamped by another database (restored from a dump, a failover, a different
server) holds orders that database may not have, so it is dropped, to be
reloaded from PostgreSQL by the next purchase (``gateway.usecases.reconciler``
compares the stamp each pass; the gateway at start-up). Driver errors become
:class:`gateway.domain.errors.RedisUnavailable`.
"""

from __future__ import annotations

from gateway.redis.connections import RedisClient, redis_call
from gateway.redis.layout import STATE_SUFFIXES, Change, channel, identity_key, sku_state_pattern

# Keys asked for per SCAN round trip, and unlinked per UNLINK, when dropping.
SCAN_CHUNK = 5000


class IdentityStamp:
    """Compares the Redis state's stamp with a database identity, and drops
    every sku's state when they differ."""

    def __init__(self, redis: RedisClient, prefix: str) -> None:
        self._redis = redis
        self._key = identity_key(prefix)
        self._channel = channel(prefix)
        self._state_pattern = sku_state_pattern(prefix)

    async def adopt(self, identity: str) -> bool:
        """Make the Redis state the state of the database ``identity`` names.

        State stamped by another database has every sku's keys dropped, and
        every instance is told (``reset:*``). State with no stamp yet is adopted
        as it is. Returns whether anything was dropped.
        """
        stamped = await redis_call(self._redis.get(self._key))
        if stamped == identity:
            return False
        if stamped is not None:
            await self._drop_state()
        await redis_call(self._redis.set(self._key, identity))
        if stamped is None:
            return False
        await redis_call(self._redis.publish(self._channel, f"{Change.RESET}:*"))
        return True

    async def _drop_state(self) -> None:
        # On a cluster scan_iter walks every primary and UNLINK is split per slot.
        doomed: list[str] = []
        async for key in self._redis.scan_iter(match=self._state_pattern, count=SCAN_CHUNK):
            if key.endswith(STATE_SUFFIXES):
                doomed.append(key)
            if len(doomed) >= SCAN_CHUNK:
                await redis_call(self._redis.unlink(*doomed))
                doomed = []
        if doomed:
            await redis_call(self._redis.unlink(*doomed))
