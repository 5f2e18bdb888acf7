"""What the gateway knows of each sku before reserving: existence, limit, strategy.

Cached in-process because every purchase needs it; a sku change announced on
pub/sub drops the entry. Unknown skus are remembered briefly so a storm of
requests for a sku that does not exist costs one query per interval.
"""

from __future__ import annotations

import asyncio

from gateway.domain.errors import UnknownSku
from gateway.domain.model import SkuInfo, Strategy
from gateway.postgres.inventory import Inventory

UNKNOWN_TTL_S = 1.0


class Catalog:
    """A cache of :class:`SkuInfo` in front of the database."""

    def __init__(
        self, inventory: Inventory, default_strategy: Strategy = Strategy.RESERVE_BATCH
    ) -> None:
        self._inventory = inventory
        self.default_strategy = default_strategy
        self._known: dict[str, SkuInfo] = {}
        self._unknown: dict[str, float] = {}

    async def get(self, sku: str) -> SkuInfo:
        """The sku's info; raises :class:`UnknownSku` when it does not exist."""
        info = self._known.get(sku)
        if info is not None:
            return info
        now = asyncio.get_running_loop().time()
        if self._unknown.get(sku, 0.0) > now:
            raise UnknownSku(f"no sku {sku!r}")
        found = await self._inventory.sku_info(sku)
        if found is None:
            self._unknown[sku] = now + UNKNOWN_TTL_S
            raise UnknownSku(f"no sku {sku!r}")
        self._known[sku] = found
        return found

    def cached(self, sku: str) -> SkuInfo | None:
        """The sku's info if this instance has it at hand, without I/O."""
        return self._known.get(sku)

    def strategy_of(self, info: SkuInfo) -> Strategy:
        """The strategy a sku sells under: its own, else the gateway's default."""
        return info.strategy or self.default_strategy

    async def strategy(self, sku: str) -> Strategy:
        """The strategy ``sku`` sells under; raises :class:`UnknownSku`."""
        return self.strategy_of(await self.get(sku))

    def forget(self, sku: str) -> None:
        """Drop what is cached of a sku (it was created or changed)."""
        self._known.pop(sku, None)
        self._unknown.pop(sku, None)

    # What the change feed tells (gateway.redis.change_feed.ChangeSubscriber).
    def stock_returned(self, sku: str) -> None:
        """Stock is not what the catalog holds: nothing to drop."""

    def sku_changed(self, sku: str) -> None:
        """An admin changed the sku: its entry is stale."""
        self.forget(sku)

    def state_dropped(self) -> None:
        """Redis dropped every sku's state: it came from another database, so may this."""
        self.forget_all()

    def feed_resumed(self) -> None:
        """Announcements may have been missed: every entry goes."""
        self.forget_all()

    def forget_all(self) -> None:
        """Drop everything (the change feed was interrupted)."""
        self._known.clear()
        self._unknown.clear()
