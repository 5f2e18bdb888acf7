"""The limit groups: one buyer limit across a group of skus (``limit_groups``,
``sql/020_limit_groups.sql``), and which sku is in which.

A group's skus name it (``inventory.limit_group``); its floor is the
``group_holdings`` rows the orders' triggers keep. Driver errors become
:class:`gateway.domain.errors.PostgresUnavailable`.
"""

from __future__ import annotations

import asyncpg

from gateway.domain.errors import GroupInUse, NoLimitGroup
from gateway.domain.model import LimitGroup
from gateway.postgres.database import as_unavailable

PUT_GROUP = """
INSERT INTO limit_groups (limit_group, per_user_limit) VALUES ($1, $2)
ON CONFLICT (limit_group) DO UPDATE SET per_user_limit = excluded.per_user_limit, updated_at = now()
RETURNING (SELECT per_user_limit FROM limit_groups WHERE limit_group = $1) AS before
"""
GROUP = """
SELECT lg.per_user_limit,
    (SELECT array_agg(m.sku ORDER BY m.sku) FROM inventory m WHERE m.limit_group = $1) AS skus
FROM limit_groups lg WHERE lg.limit_group = $1
"""
# Locked, so no sku joins it between the check and the delete (a sku's join
# reads it FOR SHARE).
LOCK_GROUP = "SELECT 1 FROM limit_groups WHERE limit_group = $1 FOR UPDATE"
GROUP_NAMED = "SELECT EXISTS (SELECT 1 FROM inventory WHERE limit_group = $1)"
DELETE_GROUP = """
WITH gone AS (DELETE FROM limit_groups WHERE limit_group = $1 RETURNING limit_group)
DELETE FROM group_holdings WHERE limit_group IN (SELECT limit_group FROM gone)
"""
GROUPED_SKUS = "SELECT sku, limit_group FROM inventory WHERE limit_group IS NOT NULL"


class LimitGroups:
    """Reads and admin changes of the limit groups."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def put(self, name: str, per_user_limit: int) -> tuple[int | None, LimitGroup]:
        """Create the group or set its limit: the limit before (None for a group
        created now) and the group as it is now."""
        with as_unavailable:
            async with self._pool.acquire() as con, con.transaction():
                before: int | None = await con.fetchval(PUT_GROUP, name, per_user_limit)
                row = await con.fetchrow(GROUP, name)
        assert row is not None  # written in this transaction
        return before, _group(name, row)

    async def get(self, name: str) -> LimitGroup:
        """The group; raises :class:`NoLimitGroup`."""
        with as_unavailable:
            row = await self._pool.fetchrow(GROUP, name)
        if row is None:
            raise NoLimitGroup(f"no limit group {name!r}")
        return _group(name, row)

    async def delete(self, name: str) -> None:
        """Delete the group; raises :class:`NoLimitGroup`, or :class:`GroupInUse`
        while a sku names it (nothing is written)."""
        with as_unavailable:
            async with self._pool.acquire() as con, con.transaction():
                if await con.fetchval(LOCK_GROUP, name) is None:
                    raise NoLimitGroup(f"no limit group {name!r}")
                if await con.fetchval(GROUP_NAMED, name):
                    raise GroupInUse(f"a sku is in limit group {name!r}")
                await con.execute(DELETE_GROUP, name)

    async def grouped_skus(self) -> dict[str, str]:
        """Every sku in a limit group, and its group."""
        with as_unavailable:
            rows = await self._pool.fetch(GROUPED_SKUS)
        return {r["sku"]: r["limit_group"] for r in rows}


def _group(name: str, row: asyncpg.Record) -> LimitGroup:
    return LimitGroup(name, row["per_user_limit"], tuple(row["skus"] or ()))
