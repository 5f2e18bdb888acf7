"""Waiting for a condition: the one polling helper of the tests and load tests."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")
POLL_S = 0.05


class GaveUp(Exception):
    """Raised by a :func:`wait_for` check when waiting longer cannot help (process died)."""


@overload
async def wait_for(
    check: Callable[[], Awaitable[T | None]],
    *,
    within: float = ...,
    what: str,
    interval: float = ...,
) -> T: ...


@overload
async def wait_for(
    check: Callable[[], T | None],
    *,
    within: float = ...,
    what: str,
    interval: float = ...,
) -> T: ...


async def wait_for(
    check: Callable[[], object],
    *,
    within: float = 5.0,
    what: str,
    interval: float = POLL_S,
) -> object:
    """Poll ``check`` until it returns a truthy value, which is returned.

    ``check`` may be a plain function or a coroutine function. An exception
    from it counts as "not yet", except :class:`GaveUp`, which propagates at
    once.

    Raises:
        TimeoutError: ``within`` seconds passed; names ``what`` and the last
            value or error seen.
    """
    deadline = time.monotonic() + within
    last: object = None
    while True:
        remaining = deadline - time.monotonic()
        try:
            async with asyncio.timeout(max(remaining, interval)):
                value = check()
                if inspect.isawaitable(value):
                    value = await value
            if value:
                return value
            last = value
        except GaveUp:
            raise
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not within {within:.1f}s (last: {last!r})")
        await asyncio.sleep(interval)
