"""A private PostgreSQL and Redis for one bench, pinned to the servers' core.

``loadtests.bench_stack`` puts the whole stack on one core: the gateway, every
PostgreSQL process and Redis. Pinning the shared servers (127.0.0.1:5432 and
:6379) would move other people's work too and leave them moved if the bench
died, so the bench starts its own, on free loopback ports, as the test suite
does (``testkit.postgres_servers``, ``testkit.redis_servers``): ``taskset``
execs the server, so the pid the harness holds is the postmaster's (or
redis-server's) own, and every process PostgreSQL forks inherits the core.

PostgreSQL runs as the ``postgres`` user (initdb refuses root) with the shared
server's durability (``fsync``, ``full_page_writes`` and ``synchronous_commit``
on: a 201 is a durable order) and otherwise PostgreSQL's defaults, autovacuum
included, as an operator's server would be; Redis without persistence, as the
shared one. Both are SIGKILLed with the harness (``PR_SET_PDEATHSIG``) and their
directories removed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from testkit.postgres_servers import PostgresCluster
from testkit.redis_servers import RedisServer

# The shared server's durability; the suite's clusters turn fsync off, a bench
# of durable orders must not.
DURABLE = {"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on"}
# pg_stat_statements for the profile (``--pg-stat-statements``); off by default,
# since it costs every statement a little.
STATEMENTS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.max": "2000",
}


def _pinned(core: int | None, argv: list[str]) -> list[str]:
    return argv if core is None else ["taskset", "--cpu-list", str(core), *argv]


class PinnedPostgres(PostgresCluster):
    """A private cluster whose postmaster (and so every process it forks) runs on ``core``."""

    def __init__(self, core: int | None, settings: Mapping[str, str] | None = None) -> None:
        super().__init__(settings={**DURABLE, **(settings or {})})
        self._child.argv = _pinned(core, self._child.argv)


class PinnedRedis(RedisServer):
    """A private redis-server (no persistence) on ``core``."""

    def __init__(self, core: int | None) -> None:
        self._core = core
        super().__init__()

    def _argv(self) -> list[str]:
        return _pinned(self._core, super()._argv())


@dataclass(frozen=True, slots=True)
class Stack:
    """The bench's own servers: their URLs and root pids."""

    pg_url: str
    redis_url: str
    pg_pid: int
    redis_pid: int


@contextlib.contextmanager
def private_stack(core: int | None, *, statements: bool = False) -> Iterator[Stack]:
    """Start a private PostgreSQL and Redis on ``core``; stop and remove them on exit.

    ``statements`` loads pg_stat_statements and creates it in the ``postgres``
    database, whose view shows every database's statements.
    """
    postgres = PinnedPostgres(core, STATEMENTS if statements else None)
    redis = PinnedRedis(core)
    try:
        asyncio.run(_start(postgres, redis, statements))
        assert postgres.pid is not None and redis.pid is not None
        yield Stack(postgres.url(), redis.url(), postgres.pid, redis.pid)
    finally:
        asyncio.run(_close(postgres, redis))


async def _start(postgres: PostgresCluster, redis: RedisServer, statements: bool) -> None:
    await postgres.start(within=60.0)
    if statements:
        # Its view, read from the postgres database, shows every database's statements.
        await postgres.fetchval("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    await redis.start()


async def _close(postgres: PostgresCluster, redis: RedisServer) -> None:
    # Each closes even if the other fails: nothing may leak.
    try:
        await redis.close()
    finally:
        await postgres.close()
