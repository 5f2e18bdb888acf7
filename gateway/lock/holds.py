"""A hold: one asyncio task's ownership of a lock through one lock object; and the
table of a lock object's holds."""

from __future__ import annotations

import asyncio
import enum
import time
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


class HoldTable(Generic[R]):
    """The holds of one lock object, by owner task, and the latest one taken."""

    def __init__(self) -> None:
        self._by_task: dict[asyncio.Task[Any], Hold[R]] = {}
        self.latest: Hold[R] | None = None

    def get(self, task: asyncio.Task[Any]) -> Hold[R] | None:
        """The hold of ``task``, if it has one."""
        return self._by_task.get(task)

    def add(self, hold: Hold[R]) -> None:
        """Record a new hold, replacing its task's previous one."""
        self._by_task[hold.task] = hold
        self.latest = hold

    def forget(self, hold: Hold[R]) -> None:
        """Drop ``hold`` unless its task has a newer one."""
        if self._by_task.get(hold.task) is hold:
            del self._by_task[hold.task]

    def drop_one(self, hold: Hold[R]) -> None:
        """Count one acquisition of ``hold`` as released; drop it after the last."""
        hold.count -= 1
        if hold.count <= 0:
            self.forget(hold)

    def of_resource(self, resource: R) -> Hold[R] | None:
        """The hold that keeps ``resource``, if any (for a backend's callbacks)."""
        return next((h for h in self._by_task.values() if h.resource is resource), None)

    def visible(self) -> Hold[R] | None:
        """The calling task's hold, else the latest one (None before any)."""
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running loop
            task = None
        hold = None if task is None else self._by_task.get(task)
        return hold if hold is not None else self.latest

    def any_live(self) -> bool:
        """Whether some hold is neither lost nor ended, and its lease has not run out."""
        now = time.monotonic()
        return any(h.live and now < h.deadline for h in self._by_task.values())
