"""The background tasks of a lock: kept referenced, shielded, undone on cancellation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

Undo = Callable[[T], Awaitable[object] | None]


class Background:
    """Owns the tasks a lock starts, so none is collected while running and no
    exception goes unretrieved (whoever awaited the task has seen it)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` as a task of its own."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._settle)
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

    def _settle(self, task: asyncio.Task[Any]) -> None:
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
