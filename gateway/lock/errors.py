"""Lock errors: one small hierarchy, each error carrying the lock's name."""

from __future__ import annotations


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
