"""Doubt of Redis's sold-out answers after this gateway saw Redis fail.

A Redis failure (a node killed, a failover) may lose the newest writes: a
replica promoted without them holds a counter, ledger, done and buyers hash
from a moment before. A committed order whose reservation and settle were
lost has no record left in Redis; once its unit is sold again (or the
reconciler lowers the counter to the database's) a replay of its request id
would be told sold out, while PostgreSQL holds its order.

Fleet-wide that is repaired where the evidence shows: the reconciler's drift
repair and a flush that finds the database short of Redis flag the sku as
rebuilding (``lua/load_stock.lua``, ``lua/settle.lua``), and while the flag is
set PostgreSQL answers replays (``gateway.usecases.rebuilds``). Until then,
a gateway that saw Redis fail checks every sold-out answer to a purchase that
carries a request id against PostgreSQL's unique ``request_id`` (coalesced,
``gateway.postgres.lookups.OrderLookups``) for :attr:`RedisDoubt.window_s`
after the last failure. The doubt covers every sku, not the one whose call
failed: a failed node holds many skus' slots, and the call that meets its
failure may be any of theirs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# The shortest doubt: several reconciler passes at the default 5 s interval
# would be 15 s; a pass during the outage fails and is retried next interval.
MIN_WINDOW_S = 10.0
# Reconciler passes a doubt outlasts: one may fail while the cluster heals, a
# lockless one needs to see a drift twice before it repairs (and flags) it.
PASSES = 3


def window_for(reconcile_interval_s: float) -> float:
    """How long a doubt lasts for a gateway whose reconciler runs every
    ``reconcile_interval_s``: long enough for its passes to flag what was lost."""
    return max(MIN_WINDOW_S, PASSES * reconcile_interval_s)


class RedisDoubt:
    """Whether this gateway saw Redis fail within the last ``window_s``."""

    __slots__ = ("_clock", "_until", "window_s")

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._until = 0.0

    def failed(self) -> None:
        """Redis failed (a call, a lock, a settle): doubt it for the window from now."""
        self._until = self._clock() + self.window_s

    def __bool__(self) -> bool:
        """Whether a failure was seen within the window (no clock read before any)."""
        return self._until != 0.0 and self._until > self._clock()
