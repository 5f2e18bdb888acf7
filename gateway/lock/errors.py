"""Lock errors: one small hierarchy, each error carrying the lock's name; and the
context manager that turns redis-py's leaked write errors into connection errors."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator

import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError

# Where redis-py's leaks are raised from: its asyncio connections, asyncio's
# transports, and uvloop's (its Cython frames are named by their source path).
_UVLOOP = "uvloop/"
_LEAKY = (
    *(os.path.dirname(m.__file__ or "") + os.sep for m in (redis.asyncio, asyncio)),
    _UVLOOP,
)


class LockError(Exception):
    """Base of every lock error; ``name`` is the lock's name (its Redis key or PG name)."""

    reason = "lock error"

    def __init__(self, name: str, detail: str | None = None) -> None:
        self.name = name
        super().__init__(f"{detail or self.reason}: {name}")


class LockTimeout(LockError):
    """``async with lock(wait=...)`` gave up: the lock stayed held by someone else."""

    reason = "timed out waiting for the lock"


class LockNotOwned(LockError):
    """The calling task holds no hold on this lock object (nothing was changed)."""

    reason = "lock not held by the current task"


class LockLost(LockError):
    """The lock was taken away while held (lease ran out, Redis or the session went away,
    another owner took it over, or ``max_hold`` passed); writes made under it must be
    checked against the fencing token."""

    reason = "lock lost while held"


@contextlib.contextmanager
def connection_errors() -> Iterator[None]:
    """Raise as ``redis.exceptions.ConnectionError`` what redis-py lets escape untyped
    when a connection is closed under a write, as seen in Redis Cluster failovers:
    an ``AttributeError`` or ``TypeError`` from its own code (redis/redis-py#4287),
    and uvloop's ``RuntimeError`` "unable to perform operation on <TCPTransport
    closed=True ...>; the handler is closed". Every caller already treats a lost
    connection, and none should have to know these.

    Only errors raised inside redis-py's, asyncio's or uvloop's own code are
    translated; the same types raised anywhere else are bugs and propagate
    unchanged.
    """
    try:
        yield
    except (AttributeError, TypeError, RuntimeError) as exc:
        if not closed_under_write(exc):
            raise
        raise RedisConnectionError(f"connection closed while writing: {exc!r}") from exc


def closed_under_write(exc: BaseException) -> bool:
    """Whether ``exc`` is one of the untyped errors :func:`connection_errors` translates:
    its type is one of those, and it was raised inside redis-py, asyncio or uvloop."""
    if not isinstance(exc, (AttributeError, TypeError, RuntimeError)):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    where = tb.tb_frame.f_code.co_filename
    if isinstance(exc, RuntimeError):
        # Only uvloop's closed handle: asyncio's own RuntimeErrors (a lock bound
        # to another loop) are bugs to see, not connections to retry.
        return where.startswith(_UVLOOP)
    return where.startswith(_LEAKY)
