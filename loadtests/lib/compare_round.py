"""What ``make compare`` runs (``loadtests.compare``): the strategies and lock
families, the (strategy, lock) :func:`matrix`, the options, and one round's
gateway settings and record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gateway.settings import Settings
from loadtests.lib.compare_faults import MASTER
from loadtests.lib.targets import Target

STRATEGIES = ("reserve-batch", "sql-direct", "optimistic", "pessimistic", "queue")
LOCKS = ("redis", "postgres", "zookeeper", "none")
# Strategies that write each purchase in its own transaction take no flush lock.
LOCKLESS = ("sql-direct", "optimistic", "pessimistic")
LEASE_S = 1.0  # short, so a stall passes it within a round
# Early, so the fault strikes while the stock is still selling even on a fast machine.
FAULT_AT_S = 0.3


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    """What to run and how hard."""

    strategies: tuple[str, ...]
    locks: tuple[str, ...]
    conditions: tuple[str, ...]
    seconds: float
    stock: int
    connections: int
    pin: bool


def matrix(strategies: Sequence[str], locks: Sequence[str]) -> list[tuple[str, str]]:
    """The (strategy, lock) pairs worth running: lockless strategies once, with none."""
    pairs = []
    for strategy in strategies:
        for lock in locks:
            if strategy in LOCKLESS and lock != "none":
                continue
            pairs.append((strategy, lock))
    return pairs


def unknown_strategy(strategy: str) -> str | None:
    """Why this gateway cannot run ``strategy`` before even starting it, or None."""
    known = {f.name for f in dataclasses.fields(Settings)}
    if strategy != "reserve-batch" and "strategy" not in known:
        return "this gateway has no GATEWAY_STRATEGY setting (only reserve-batch)"
    return None


def gateway_settings(
    strategy: str, lock: str, prefix: str, zk_hosts: str | None, sentinels: str | None
) -> dict[str, str]:
    """The GATEWAY_* variables of both gateways of one round."""
    settings = {
        "GATEWAY_FLUSH_LOCK": lock,
        "GATEWAY_LOCK_LEASE_S": str(LEASE_S),
        "GATEWAY_KEY_PREFIX": prefix,
        # The reconciler settles what a fault left within the round's settle time.
        "GATEWAY_RESERVATION_TIMEOUT_S": "2",
        "GATEWAY_RECONCILE_INTERVAL_S": "0.5",
        "GATEWAY_LOG_LEVEL": "warning",
    }
    if strategy != "reserve-batch":
        settings["GATEWAY_STRATEGY"] = strategy
    if zk_hosts is not None:
        settings["GATEWAY_ZOOKEEPER_HOSTS"] = zk_hosts
    if sentinels is not None:
        settings["GATEWAY_REDIS_SENTINELS"] = sentinels
        settings["GATEWAY_REDIS_SENTINEL_MASTER"] = MASTER
    return settings


@dataclasses.dataclass
class Round:
    """One (strategy, lock, condition) run: its gateways and what it needs."""

    strategy: str
    lock: str
    condition: str
    database_url: str
    settings: dict[str, str]
    redis_url: str
    sku: str
    gateways: list[Target] = dataclasses.field(default_factory=list)
    # The gateway a stall stopped: latency is read from the other one.
    stopped: Target | None = None

    @property
    def faulted(self) -> bool:
        """Whether this round strikes a fault (and so runs longer, to show recovery)."""
        return self.condition != "none"
