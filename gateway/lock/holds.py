"""A hold: one asyncio task's ownership of a lock through one lock object."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

R = TypeVar("R")  # what a backend keeps per hold (PostgreSQL: its connection)


class HoldState(enum.Enum):
    """Where a hold is in its life."""

    LIVE = "live"
    LOST = "lost"
    ENDED = "ended"


@dataclass(eq=False, slots=True)
class Grant(Generic[R]):
    """A backend's answer to a successful first acquisition."""

    fence: int
    resource: R
    contended: bool
    sent_at: float  # when the winning request left: the lease counts from here


@dataclass(eq=False, slots=True)
class Hold(Generic[R]):
    """One task's ownership of the lock, with its re-entry count and local deadline.

    ``deadline`` is the send time of the last confirmed renewal plus the lease: past
    it, someone else may hold the lock whatever the backend said last.
    """

    task: asyncio.Task[Any]
    owner: str
    fence: int
    resource: R
    acquired_at: float
    renewed_at: float
    deadline: float
    count: int = 1
    state: HoldState = HoldState.LIVE
    closing: bool = False  # the final release is in flight: a vanished key is expected
    cancelled_owner: bool = False  # the watchdog cancelled the task; an __aexit__ uncancels
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    entries: list[int] = field(default_factory=list)  # task.cancelling() at each `async with`
    timer: asyncio.TimerHandle | None = None  # starts the watchdog at the first renewal
    watchdog: asyncio.Task[None] | None = None

    @property
    def live(self) -> bool:
        """Neither lost nor ended."""
        return self.state is HoldState.LIVE
