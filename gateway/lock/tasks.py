"""The tasks of a lock: its owners, named; its background work, kept referenced,
shielded, and undone on cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

Undo = Callable[[T], Awaitable[object] | None]


class Owners:
    """Names the asyncio tasks that hold a lock through one lock object.

    An owner id is "pid:random" of the object and ":serial" of the task. The pid
    makes a holder findable from outside (HGET <lock> owner), as Redisson's
    UUID:threadId does; the random part keeps objects apart; serials rather than
    id(task), since ids are reused once a task is collected.
    """

    def __init__(self) -> None:
        self._uid = f"{os.getpid()}:{uuid.uuid4().hex[:16]}"
        self._serials: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = (
            weakref.WeakKeyDictionary()
        )
        self._next_serial = itertools.count(1)

    @staticmethod
    def current(lock_name: str) -> asyncio.Task[Any]:
        """The calling task; RuntimeError outside one."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError(f"lock {lock_name!r} used outside an asyncio task")
        return task

    def id_of(self, task: asyncio.Task[Any]) -> str:
        """The owner id of ``task``, the same for as long as the task lives."""
        serial = self._serials.get(task)
        if serial is None:
            serial = self._serials[task] = next(self._next_serial)
        return f"{self._uid}:{serial}"


class Background:
    """Owns the tasks a lock starts, so none is collected while running and no
    exception goes unretrieved (whoever awaited the task has seen it)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` as a task of its own."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._forget)
        return task

    async def shielded(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` to completion even if the caller is cancelled meanwhile."""
        return await asyncio.shield(self.spawn(coro))

    async def undoable(self, call: Coroutine[Any, Any, T], undo: Undo[T]) -> T:
        """Run a call that takes something (a lock, a hold). If the caller is cancelled
        meanwhile, let the call finish and, if it succeeded, ``undo(result)`` before the
        cancellation propagates: a cancelled acquisition leaves nothing behind."""
        inner = self.spawn(call)
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            cleanup = self.spawn(_undo_when_done(inner, undo))
            with contextlib.suppress(asyncio.CancelledError):  # cancelled again: it goes on
                await asyncio.shield(cleanup)
            raise

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()


async def _undo_when_done(inner: asyncio.Task[T], undo: Undo[T]) -> None:
    try:
        result = await inner
    except Exception:
        return  # it failed, so it took nothing
    action = undo(result)
    if action is not None:
        await action


def stop_if_cancelled(exc: BaseException) -> None:
    """Raise CancelledError when the running task is being cancelled: ``exc`` then
    took the cancellation's place. A context manager's exit that fails on the way
    out does that, such as a lock's release or a transaction's end on a connection
    gone at shutdown. A loop that logs a failure and tries again calls this first:
    a reconciler that caught such an error as one sku's failure went on to the
    next sku, pass after pass, and its task never stopped."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc


async def rest(seconds: float) -> None:
    """Sleep between a loop's passes, unless the running task is being cancelled:
    then raise CancelledError. A client library can swallow a cancel mid-call:
    redis-py sends each command through ``asyncio.wait_for`` when a socket
    timeout is set, and on Python 3.11 ``wait_for`` returns the finished send's
    result and drops a cancel that lands in the same turn (CPython gh-86296,
    fixed in 3.12). The pass then ends as if nothing happened, and a loop that
    only slept went on for good: a test's watcher of Redis keys did, until
    pytest's timeout. Unlike :func:`stop_if_cancelled`, nothing failed here."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
    await asyncio.sleep(seconds)
