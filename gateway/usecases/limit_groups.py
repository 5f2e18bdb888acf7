"""The limit groups' admin use case: create a group or set its limit, read it,
delete it (``/admin/limit-groups/{group}``).

A group's limit is part of what a purchase of each of its skus knows (its
catalog entry's :class:`gateway.domain.model.LimitGroup`), so a change of it
is announced for every sku of the group: every instance's catalog drops them.
Which sku is in which group is set on the sku (``gateway.usecases.admin``).
"""

from __future__ import annotations

from typing import Any

from gateway.usecases.ports import CatalogForgetting, GroupStore, SkuAnnouncer


class LimitGroupsAdmin:
    """Create, read and delete limit groups."""

    def __init__(
        self, *, store: GroupStore, announcer: SkuAnnouncer, catalog: CatalogForgetting
    ) -> None:
        self._store = store
        self._announcer = announcer
        self._catalog = catalog

    async def put(self, name: str, per_user_limit: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """Create ``name`` or set its limit: the API's answer and what changed
        (``per_user_limit`` as ``[before, after]``, before None when created)."""
        before, group = await self._store.put(name, per_user_limit)
        if before != per_user_limit:
            for sku in group.skus:
                self._catalog.forget(sku)
                await self._announcer.announce(sku)
        done = {
            "group": name,
            "created": before is None,
            "set": {"per_user_limit": [before, per_user_limit]},
        }
        return group.as_json(), done

    async def get(self, name: str) -> dict[str, Any]:
        """The group as the API shows it; raises :class:`NoLimitGroup`."""
        return (await self._store.get(name)).as_json()

    async def delete(self, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """Delete ``name``; raises :class:`NoLimitGroup`, or :class:`GroupInUse`
        while a sku is in it."""
        await self._store.delete(name)
        return {"group": name, "deleted": True}, {"group": name, "deleted": True}
