"""What the stock administration's and the reconciler's unit tests share:
a sku's counter and ledger in memory (:class:`Redis`), its lock and its
rebuilds, each keeping a Protocol of ``gateway.usecases.ports``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from gateway.domain.model import Verdict
from gateway.domain.stock import Pending, Settlement, Snapshot, StockLoad

SKU = "sku-1"
TIMEOUT_S = 30.0


class Tags:
    """Key tags nobody groups."""

    def group_of(self, sku: str) -> str | None:
        return None

    def set(self, sku: str, group: str | None) -> None:
        pass

    def replace(self, groups: dict[str, str]) -> None:
        pass


@dataclass
class Redis:
    """A sku's counter and ledger, with every settle and load recorded."""

    counters: dict[str, int] = field(default_factory=dict)
    ledgers: dict[str, dict[str, Pending]] = field(default_factory=dict)
    settled: list[Settlement] = field(default_factory=list)
    loads: list[tuple[str, int, StockLoad]] = field(default_factory=list)
    tags: Tags = field(default_factory=Tags)

    def reserve(self, rid: str, qty: int = 1, *, age_s: float = TIMEOUT_S * 2) -> Pending:
        """A reservation ``age_s`` old: its units off the counter, in the ledger."""
        at = int((time.time() - age_s) * 1000)
        entry = Pending(rid, f"u-{rid}", qty, at)
        self.ledgers.setdefault(SKU, {})[rid] = entry
        self.counters[SKU] = self.counters.get(SKU, 0) - qty
        return entry

    async def load_stock(self, sku: str, db_stock: int, mode: StockLoad) -> int:
        after = db_stock - sum(p.qty for p in self.ledgers.get(sku, {}).values())
        self.counters[sku] = after
        self.loads.append((sku, db_stock, mode))
        return after

    async def forget_stock(self, sku: str) -> None:
        self.counters.pop(sku, None)

    async def drop_state(self, sku: str) -> None:
        self.counters.pop(sku, None)
        self.ledgers.pop(sku, None)

    async def announce(self, sku: str) -> None:
        pass

    async def available(self, sku: str) -> int | None:
        return self.counters.get(sku)

    async def pending(self, sku: str) -> list[Pending]:
        return list(self.ledgers.get(sku, {}).values())

    async def snapshot(self, sku: str) -> Snapshot:
        return Snapshot(self.counters.get(sku), await self.pending(sku))

    async def settle(
        self, sku: str, settlements: Iterable[Settlement], db_stock_after: int | None
    ) -> int:
        for s in settlements:
            entry = self.ledgers[sku].pop(s.request_id)
            if s.verdict is not Verdict.CONFIRMED:
                self.counters[sku] += entry.qty
            self.settled.append(s)
        return self.counters[sku]

    async def returns_given(self, sku: str) -> int:
        return 0

    async def returned(self, sku: str, request_ids: Sequence[str]) -> set[str]:
        return set()


class Locks:
    """A lock family, or none (``enabled`` false)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled

    @asynccontextmanager
    async def held(self, sku: str) -> AsyncIterator[None]:
        yield


class Rebuilds:
    """The rebuilds started."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def ensure(self, sku: str) -> None:
        self.started.append(sku)
