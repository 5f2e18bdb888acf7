"""Redis backend: a Redisson-style re-entrant lease lock with fencing tokens.

The lock is a hash at key ``name`` — owner, hold count, fence — expiring with the lease;
``name + ":fence"`` counts fencing tokens (expiring ``fence_ttl`` after the last
acquisition) and ``name + ":unlock"`` is the channel a release publishes on. Give
``name`` a hash tag (``fs:{sku1}:lock``) and all three land in one cluster slot. Every
change goes through the Lua scripts in this package's ``lua/`` (package data, called
by EVALSHA through redis-py's ``AsyncScript``, which reloads a script Redis forgot).
Fences are INCR raised to Redis's clock in microseconds, so they keep increasing after
a restart or failover that lost the counter, or after it expired.

On a Redis Cluster (``RedisCluster`` client) the three keys of a lock share its slot,
so each script runs on the node holding the sku; the release's PUBLISH reaches the
subscriber on whichever node it listens (see ``subscriber``).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from gateway.lock.base import BaseLock
from gateway.lock.errors import connection_errors
from gateway.lock.holds import Grant, Hold
from gateway.lock.metrics import LockMetrics
from gateway.lock.subscriber import LockSubscriber

# Never sleep less than this between attempts, even when the holder's TTL is ~0.
_MIN_PAUSE_S = 0.001
# How often a waiter that cannot hear unlock messages tries again.
_UNHEARD_POLL_S = 0.05


SCRIPT_NAMES = ("acquire", "renew", "release")


@functools.cache
def script_source(name: str) -> str:
    """The text of one of this package's Lua scripts, read once per process."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text()


@dataclass(frozen=True, slots=True)
class LockScripts:
    """The three lock scripts, registered with one client."""

    acquire: AsyncScript
    renew: AsyncScript
    release: AsyncScript

    @classmethod
    def on(cls, redis: Redis | RedisCluster) -> LockScripts:
        """The scripts as called through ``redis``."""
        return cls(*(AsyncScript(redis, script_source(name)) for name in SCRIPT_NAMES))


async def load_lock_scripts(redis: Redis | RedisCluster) -> None:
    """SCRIPT LOAD the lock scripts, so a broken script fails start-up, not a flush
    (on a cluster, on every primary)."""
    for name in SCRIPT_NAMES:
        await redis.script_load(script_source(name))


class RedisLock(BaseLock[None]):
    """A re-entrant distributed lock on Redis, owned by (lock object, asyncio task).

    Args:
        redis: the client; its pool serves the scripts and, once, the shared subscriber.
        name: the lock's key, with a hash tag, e.g. ``fs:{sku1}:lock``.
        lease: seconds the lock outlives its last renewal; the watchdog renews every
            lease/3 while held.
        max_hold: stop renewing this many seconds after acquisition; the hold is then
            lost when its lease runs out.
        metrics: a :class:`LockMetrics`; a fresh :class:`LockStats` if None.
        fence_ttl: seconds the fence counter outlives the last acquisition; the
            next token after it is Redis's clock, past every token given before.
        subscriber: the unlock subscriber waiters register with; share one per client
            and process, so a thousand waiters cost one connection.
    """

    def __init__(
        self,
        redis: Redis | RedisCluster,
        name: str,
        *,
        lease: float = 30.0,
        max_hold: float | None = None,
        metrics: LockMetrics | None = None,
        fence_ttl: float = 86_400.0,
        subscriber: LockSubscriber,
    ) -> None:
        super().__init__(name, lease=lease, max_hold=max_hold, metrics=metrics)
        self._subscriber = subscriber
        self.fence_key = name + ":fence"
        self.channel = name + ":unlock"
        self._lease_ms = max(1, round(lease * 1000))
        self._fence_ttl_ms = max(1, round(fence_ttl * 1000))
        self._scripts = LockScripts.on(redis)

    async def _grant(self, owner: str, deadline: float | None) -> Grant[None] | None:
        sent = time.monotonic()
        won, value = await self._attempt(owner)
        if won:
            return Grant(value, None, contended=False, sent_at=sent)
        if deadline is not None and time.monotonic() >= deadline:
            return None
        async with self._subscriber.subscription(self.channel) as waiter:
            while True:
                sent = time.monotonic()
                won, value = await self._attempt(owner)
                waiter.use_wake()
                if won:
                    return Grant(value, None, contended=True, sent_at=sent)
                pause = self._pause(value, deadline)
                if pause is None:
                    return None
                if not waiter.listening:
                    # An unlock may have gone by unheard: sleeping to the end of
                    # the holder's lease would strand this waiter for up to a
                    # lease (10 s by default) behind a 50 ms hold.
                    pause = min(pause, _UNHEARD_POLL_S)
                await waiter.wait(pause)

    def _pause(self, pttl_ms: int, deadline: float | None) -> float | None:
        """Sleep before the next attempt if no unlock message comes: until the holder's
        lease runs out at the latest, and never past our deadline (None: it passed)."""
        pause = max(pttl_ms / 1000, _MIN_PAUSE_S) if pttl_ms >= 0 else self.lease
        if deadline is None:
            return pause
        left = deadline - time.monotonic()
        return None if left <= 0 else min(pause, left)

    async def _attempt(self, owner: str) -> tuple[bool, int]:
        keys, args = (self.name, self.fence_key), (owner, self._lease_ms, self._fence_ttl_ms)
        call = _run(self._scripts.acquire, keys, args)
        reply = await self._bg.undoable(
            call, lambda r: self._release_as(owner) if r[0] == 1 else None
        )
        return reply[0] == 1, int(reply[1])

    async def _reenter(self, hold: Hold[None]) -> bool:
        call = self._renew_as(hold.owner, 1)
        count = await self._bg.undoable(call, lambda c: self._release_as(hold.owner) if c else None)
        return int(count) > 0

    async def _release_one(self, hold: Hold[None]) -> int:
        return int(await self._release_as(hold.owner))

    async def _renew(self, hold: Hold[None]) -> bool:
        return int(await self._renew_as(hold.owner, 0)) > 0

    async def _renew_as(self, owner: str, add: int) -> Any:
        return await _run(self._scripts.renew, (self.name,), (owner, self._lease_ms, add))

    async def _release_as(self, owner: str) -> Any:
        return await _run(self._scripts.release, (self.name, self.channel), (owner, self._lease_ms))


async def _run(script: AsyncScript, keys: tuple[str, ...], args: tuple[str | int, ...]) -> Any:
    with connection_errors():
        return await script(keys, args)
