"""Which limit group tags each sku's Redis keys, as PostgreSQL says.

A sku in a limit group keeps its Redis state in the group's slot
(``gateway.redis.layout.KeyTags``), so every adapter that builds its keys must
know its group. This instance learns them all at start-up, again whenever the
change feed says a sku changed or may have (an admin moved a sku between
groups, or announcements were missed), and each sku's from its catalog entry
as it is read (``gateway.usecases.catalog``).
"""

from __future__ import annotations

import asyncio

import structlog

from gateway.domain.errors import Unavailable
from gateway.usecases.ports import GroupStore, Tags

log = structlog.get_logger(__name__)


class GroupTags:
    """Keeps ``tags`` as PostgreSQL's ``inventory.limit_group`` says."""

    def __init__(self, *, tags: Tags, store: GroupStore) -> None:
        self._tags = tags
        self._store = store
        self._reload: asyncio.Task[None] | None = None
        self._again = False

    async def load(self) -> None:
        """Read every grouped sku's group now; raises :class:`Unavailable`."""
        self._tags.replace(await self._store.grouped_skus())

    def _schedule(self) -> None:
        """Read them again in the background, once for a burst of announcements."""
        if self._reload is not None and not self._reload.done():
            self._again = True
            return
        self._reload = asyncio.get_running_loop().create_task(self._reloading())

    async def _reloading(self) -> None:
        while True:
            self._again = False
            try:
                await self.load()
            except Unavailable as exc:
                log.warning("group_tags_unread", cause=str(exc))
            if not self._again:
                return

    async def reloaded(self) -> None:
        """Wait for the reload under way, if any, to end."""
        if self._reload is not None:
            await asyncio.shield(self._reload)

    async def close(self) -> None:
        """Stop a reload under way."""
        if self._reload is not None:
            self._reload.cancel()
            await asyncio.gather(self._reload, return_exceptions=True)

    # What the change feed tells (gateway.redis.change_feed.ChangeSubscriber).
    def stock_returned(self, sku: str) -> None:
        """Stock is not a sku's group: nothing to read."""

    def sku_changed(self, sku: str) -> None:
        """An admin changed ``sku``: perhaps its group."""
        self._schedule()

    def state_dropped(self) -> None:
        """Redis's state came from another database: so may the groups."""
        self._schedule()

    def feed_resumed(self) -> None:
        """Announcements may have been missed."""
        self._schedule()
