"""What the gateway knows of each sku before reserving: existence, limit, strategy.

Cached in-process because every purchase needs it; a sku change announced on
pub/sub drops the entry. Unknown skus are remembered briefly so a storm of
requests for a sku that does not exist costs one query per interval; at most
:data:`UNKNOWN_MAX` of them, the least recently asked for forgotten first, since
anyone may name a new one with every request.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from gateway.domain.errors import UnknownSku
from gateway.domain.model import SkuInfo, Strategy
from gateway.usecases.ports import SkuInfos, Tags

UNKNOWN_TTL_S = 1.0
# Unknown skus remembered at once: a storm for a few of them is what the
# memory is for; thousands of distinct names each cost a query regardless.
UNKNOWN_MAX = 1024


class Catalog:
    """A cache of :class:`SkuInfo` in front of the database."""

    def __init__(
        self,
        inventory: SkuInfos,
        default_strategy: Strategy,
        tags: Tags,
    ) -> None:
        self._inventory = inventory
        # Told each sku's limit group as its entry is read: its keys' tag.
        self._tags = tags
        self.default_strategy = default_strategy
        self._known: dict[str, SkuInfo] = {}
        # Least recently asked for first (an LRU).
        self._unknown: OrderedDict[str, float] = OrderedDict()

    async def get(self, sku: str) -> SkuInfo:
        """The sku's info; raises :class:`UnknownSku` when it does not exist."""
        info = self._known.get(sku)
        if info is not None:
            return info
        now = asyncio.get_running_loop().time()
        if self._unknown.get(sku, 0.0) > now:
            self._unknown.move_to_end(sku)
            raise UnknownSku(f"no sku {sku!r}")
        found = await self._inventory.sku_info(sku)
        if found is None:
            self._remember_unknown(sku, now + UNKNOWN_TTL_S)
            raise UnknownSku(f"no sku {sku!r}")
        self._known[sku] = found
        self._tags.set(sku, None if found.group is None else found.group.name)
        return found

    def _remember_unknown(self, sku: str, until: float) -> None:
        """Remember ``sku`` as unknown until ``until``, forgetting the least
        recently asked for beyond UNKNOWN_MAX."""
        self._unknown[sku] = until
        self._unknown.move_to_end(sku)
        if len(self._unknown) > UNKNOWN_MAX:
            self._unknown.popitem(last=False)

    @property
    def unknown_remembered(self) -> int:
        """How many unknown skus are remembered now."""
        return len(self._unknown)

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
