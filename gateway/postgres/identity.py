"""Which database this is, as one text: what the Redis state is stamped with.

Redis state is true of the database its orders were committed in only
(``gateway.redis.identity``), so the identity must change whenever the orders
may: a database restored from a dump into a new database, another cluster, a
standby promoted by a failover, a point-in-time recovery. Driver errors become
:class:`gateway.domain.errors.PostgresUnavailable`.
"""

from __future__ import annotations

import asyncpg

from gateway.postgres.database import as_unavailable

# The cluster's system identifier, the database's oid and the WAL timeline (the
# first 8 hex digits of the current WAL file's name). A restore into a new
# database, or another cluster, differs in the first two; a promoted standby or
# a point-in-time recovery shares them with its origin but starts a new timeline.
DATABASE_IDENTITY = """
SELECT (SELECT system_identifier FROM pg_control_system())::text || ':'
    || (SELECT oid FROM pg_database WHERE datname = current_database())::text || ':'
    || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)
"""
# Where pg_control_system() is not granted (some managed services): the oid alone.
DATABASE_OID = """
SELECT '?:' || (SELECT oid FROM pg_database WHERE datname = current_database())::text
"""


class DatabaseIdentity:
    """Reads the identity of the database a pool is connected to."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def read(self) -> str:
        """The identity (see :data:`DATABASE_IDENTITY`)."""
        with as_unavailable:
            try:
                value: str = await self._pool.fetchval(DATABASE_IDENTITY)
            except asyncpg.InsufficientPrivilegeError:
                value = await self._pool.fetchval(DATABASE_OID)
        return value
