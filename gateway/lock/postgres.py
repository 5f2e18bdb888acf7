"""PostgreSQL backend: a session advisory lock held on one pool connection.

The lock lives as long as the session: a holder whose process dies frees it at once, but
a holder that is merely stopped keeps it (there is no lease on the server). The "lease"
here is how long the watchdog tolerates not hearing from the session: every lease/3 it
runs ``SELECT 1``; a closed connection, or no answer before the local deadline, loses
the lock. Fences come from the sequence ``lock_fence_seq``, which
:func:`create_fence_sequence` creates (once per database, before the first lock), raised
to the server clock in microseconds as the Redis lock's are, so tokens of both backends
share one scale and switching backends fences nobody out.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from gateway.lock.base import BaseLock
from gateway.lock.errors import LockError
from gateway.lock.holds import Grant, Hold
from gateway.lock.metrics import LockMetrics

FENCE_SEQUENCE = "lock_fence_seq"
# The package's whole schema. Taken under a transaction-scoped advisory lock, since
# two sessions running CREATE ... IF NOT EXISTS at once may both try to create it.
_CREATE_FENCE_SEQUENCE = f"CREATE SEQUENCE IF NOT EXISTS {FENCE_SEQUENCE}"
_DDL_LOCK = "SELECT pg_advisory_xact_lock($1)"

_TRY_LOCK = "SELECT pg_try_advisory_lock($1)"
_LOCK = "SELECT pg_advisory_lock($1)"
_UNLOCK = "SELECT pg_advisory_unlock($1)"
_NEXT_FENCE = f"""
SELECT setval('{FENCE_SEQUENCE}', greatest(
    nextval('{FENCE_SEQUENCE}'),
    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint))
"""


async def create_fence_sequence(con: asyncpg.Connection[Any] | PoolConnectionProxy[Any]) -> None:
    """Create the fence sequence :class:`PgAdvisoryLock` needs, if missing."""
    async with con.transaction():
        await con.execute(_DDL_LOCK, advisory_key(FENCE_SEQUENCE))
        await con.execute(_CREATE_FENCE_SEQUENCE)


def advisory_key(name: str) -> int:
    """The stable signed 64-bit advisory lock key of ``name`` (first 8 bytes of SHA-256)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@dataclass(eq=False, slots=True)
class PgSession:
    """The pool connection a hold keeps, and a lock so one query runs on it at a time."""

    con: PoolConnectionProxy[Any]
    io: asyncio.Lock = field(default_factory=asyncio.Lock)
    returned: bool = False


class PgAdvisoryLock(BaseLock[PgSession]):
    """A re-entrant distributed lock on a PostgreSQL session advisory lock.

    Same interface and semantics as :class:`RedisLock`. Each waiter holds a pool
    connection while it waits in ``pg_advisory_lock`` (woken by the server the moment
    the lock is free), so size the pool for holders plus waiters.

    Args:
        pool: an asyncpg pool on a database where :func:`create_fence_sequence` ran.
        name: any string; hashed to the advisory key with :func:`advisory_key`.
        lease: seconds the watchdog tolerates an unanswered session; checks every lease/3.
        max_hold: seconds after acquisition at which the hold ends and counts as lost.
        metrics: a :class:`LockMetrics`; a fresh :class:`LockStats` if None.
    """

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        name: str,
        *,
        lease: float = 30.0,
        max_hold: float | None = None,
        metrics: LockMetrics | None = None,
    ) -> None:
        super().__init__(name, lease=lease, max_hold=max_hold, metrics=metrics)
        self._pool = pool
        self.key = advisory_key(name)

    async def _grant(self, owner: str, deadline: float | None) -> Grant[PgSession] | None:
        # Even "try once" needs a connection to try with: wait at least a second for one.
        pool_wait = None if deadline is None else max(deadline - time.monotonic(), 1.0)
        try:
            con = await self._pool.acquire(timeout=pool_wait)
        except TimeoutError:
            return None
        granted = False
        try:
            contended = not await con.fetchval(_TRY_LOCK, self.key)
            if contended and not await self._wait_in_server(con, deadline):
                return None
            sent = time.monotonic()  # the session answered now: the lease counts from here
            fence = await self._next_fence(con)
            granted = True
            return Grant(fence, PgSession(con), contended, sent)
        finally:
            if not granted:
                # The pool's reset runs pg_advisory_unlock_all(): a lock granted just as
                # we gave up (timeout, cancellation) goes with it.
                await self._pool.release(con)

    async def _wait_in_server(self, con: PoolConnectionProxy[Any], deadline: float | None) -> bool:
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            return False
        try:
            await con.execute(_LOCK, self.key, timeout=timeout)
        except TimeoutError:
            return False
        return True

    async def _next_fence(self, con: PoolConnectionProxy[Any]) -> int:
        try:
            return int(await con.fetchval(_NEXT_FENCE))
        except asyncpg.UndefinedTableError as exc:
            raise LockError(self.name, f"sequence {FENCE_SEQUENCE} is missing") from exc

    async def _reenter(self, hold: Hold[PgSession]) -> bool:
        return not hold.resource.con.is_closed()

    async def _release_one(self, hold: Hold[PgSession]) -> int:
        if hold.count > 1:
            return hold.count - 1
        session = hold.resource
        try:
            async with session.io:
                freed = await session.con.fetchval(_UNLOCK, self.key)
        except Exception:
            if session.con.is_closed():  # the session died, and its lock with it
                return -1
            raise
        if not freed:
            return -1
        await self._return(session)
        return 0

    async def _renew(self, hold: Hold[PgSession]) -> bool:
        session = hold.resource
        if session.con.is_closed():
            return False
        try:
            async with session.io:
                await session.con.fetchval("SELECT 1")
        except Exception:
            if session.con.is_closed():
                return False
            raise
        return True

    async def _discard(self, hold: Hold[PgSession]) -> None:
        async with hold.resource.io:
            await self._return(hold.resource)

    async def _return(self, session: PgSession) -> None:
        if session.returned:
            return
        session.returned = True
        # A broken connection is terminated by the pool, which is all we want.
        with contextlib.suppress(Exception):
            await self._pool.release(session.con)
