"""What a lock reports about itself: the :class:`LockMetrics` protocol and an in-memory default."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol


class LockMetrics(Protocol):
    """Receives lock events; a Prometheus implementation can be plugged in by the application.

    Every method is called on the event loop and must not block.
    """

    def acquired(self, wait_s: float, *, contended: bool) -> None:
        """A first acquisition (not a re-entry) after ``wait_s`` seconds; ``contended``
        if the first attempt found the lock held."""

    def released(self, held_s: float) -> None:
        """The last hold was released normally after ``held_s`` seconds."""

    def timed_out(self) -> None:
        """An acquisition gave up when its wait ran out."""

    def renewed(self) -> None:
        """The watchdog extended the lease (or, for PostgreSQL, saw the session alive)."""

    def renewal_failed(self) -> None:
        """One renewal attempt failed (error or timeout); the watchdog retries until the
        local deadline."""

    def lost(self) -> None:
        """A hold was lost: ``lost`` set and, inside ``async with``, the body cancelled."""

    def fenced_out(self) -> None:
        """A write under this lock was rejected by its fencing token (called by the writer,
        never by the lock itself)."""


@dataclass(slots=True)
class LockStats:
    """Plain counters implementing :class:`LockMetrics`; the default when none is given.

    ``waits`` keeps only the most recent wait times so a long-lived process does not grow.
    """

    acquisitions: int = 0
    contended: int = 0
    releases: int = 0
    timeouts: int = 0
    renewals: int = 0
    renewal_failures: int = 0
    losses: int = 0
    fenced_outs: int = 0
    wait_total_s: float = 0.0
    wait_max_s: float = 0.0
    held_total_s: float = 0.0
    waits: deque[float] = field(default_factory=lambda: deque(maxlen=1024))

    def acquired(self, wait_s: float, *, contended: bool) -> None:
        """Count an acquisition and record how long it waited."""
        self.acquisitions += 1
        self.contended += contended
        self.wait_total_s += wait_s
        self.wait_max_s = max(self.wait_max_s, wait_s)
        self.waits.append(wait_s)

    def released(self, held_s: float) -> None:
        """Count a final release."""
        self.releases += 1
        self.held_total_s += held_s

    def timed_out(self) -> None:
        """Count an acquisition whose wait ran out."""
        self.timeouts += 1

    def renewed(self) -> None:
        """Count a successful renewal."""
        self.renewals += 1

    def renewal_failed(self) -> None:
        """Count a failed renewal attempt."""
        self.renewal_failures += 1

    def lost(self) -> None:
        """Count a lost hold."""
        self.losses += 1

    def fenced_out(self) -> None:
        """Count a write rejected by its fencing token."""
        self.fenced_outs += 1
