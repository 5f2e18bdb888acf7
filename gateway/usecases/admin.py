"""Stock administration: create or reset a sku, restock it, report on it, archive
it, list the skus.

Each change writes the database (with its stock movement) and then sets the
Redis counter to database stock minus the pending ledger, under the sku's
flush lock so no flush commits in between; a counter that was missing comes
back flagged as rebuilding, and its buyers and done hashes are written back in
the background (``gateway.usecases.rebuilds``). A sku whose strategy keeps no Redis
state (``Strategy.reserves`` false) has no counter: putting it there deletes
the counter, and restocking it touches the database alone.

Archiving a sku (``DELETE /admin/skus/{sku}``) retires it: purchases of it are
404 ``unknown_sku`` on every instance (the change feed drops it from their
catalogs), its Redis counter goes, and its orders, movements and audit stay.
The reconciler settles what it still has pending, then leaves it. A ``PUT`` of
an archived sku lists it again, as a shop re-listing an item expects; its old
orders still count (one order per buyer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.domain.errors import LimitGroupLocked, UnknownSku
from gateway.domain.model import Display, SkuSettings, StockReport
from gateway.domain.rules import rfc3339
from gateway.domain.skus import IfMissing
from gateway.domain.stock import StockLoad
from gateway.usecases.catalog import Catalog
from gateway.usecases.limit_groups import LimitGroupsAdmin
from gateway.usecases.ports import Counters, GroupStore, OrderBooks, Rebuilding, SkuLocking, SkuRows
from gateway.usecases.servable import Servability
from gateway.usecases.sold_out import SoldOut

# Fields of a sku's answer left out when not set (null in the change log).
ANSWERED_WHEN_SET = ("waiting_room", "title", "image_url", "price_text", "limit_group")
DISPLAY_FIELDS = ("title", "image_url", "price_text")


class StockAdmin:
    """The admin use cases: stock changes in both stores, and reports."""

    def __init__(
        self,
        *,
        reservations: Counters,
        orders: OrderBooks,
        inventory: SkuRows,
        locks: SkuLocking,
        catalog: Catalog,
        soldout: SoldOut,
        servability: Servability,
        rebuilds: Rebuilding,
        groups: GroupStore,
    ) -> None:
        self._groups = groups
        # The limit groups' own routes (gateway.usecases.limit_groups).
        self.limit_groups = LimitGroupsAdmin(store=groups, announcer=reservations, catalog=catalog)
        self._reservations = reservations
        self._servability = servability
        self._orders = orders
        self._inventory = inventory
        self._locks = locks
        self._catalog = catalog
        self._soldout = soldout
        self._rebuilds = rebuilds

    async def change_sku(
        self, sku: str, fields: Mapping[str, Any], *, if_missing: IfMissing
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Set ``fields`` (:class:`SkuSettings` attributes) on ``sku``, keeping the
        others: ``PUT`` gives them all and creates a missing sku
        (``IfMissing.CREATE``), ``PATCH`` the ones it changes. Orders stay.
        Returns the API's answer and what changed, each field set as ``[before,
        after]`` (before None for a sku created now). Raises :class:`UnknownSku`
        (``IfMissing.REFUSE``), :class:`InvalidRequest` for a window that would
        end before it starts and :class:`NotConfigured` for a waiting room this
        instance could not serve."""
        self._servability.check(fields.get("waiting_room"), fields.get("payment_window_s"))
        redis_stock: int | None = None
        async with self._locks.held(sku):
            if "limit_group" in fields and fields["limit_group"] != await self._group_of(sku):
                await self._refuse_pending(sku)
            changed = await self._inventory.change_sku(sku, fields, if_missing=if_missing)
            if changed is None:
                raise UnknownSku(f"no sku {sku!r}")
            before, after, unarchived = changed
            moved = before is not None and before.limit_group != after.limit_group
            if moved:
                await self._move(sku, after)
            elif before is None and after.limit_group is not None:
                self._reservations.tags.set(sku, after.limit_group)
            selling = after.strategy or self._catalog.default_strategy
            if not selling.reserves:
                await self._reservations.forget_stock(sku)
            else:
                redis_stock = await self._reset(sku, after.stock, fresh=before is None)
        self._forget(sku)
        if moved or (before is None and after.limit_group is not None):
            await self._announce_group(sku, before, after)
        shown = after.as_json()
        answer = {"sku": sku, **shown, "strategy": selling.value, "redis_stock": redis_stock}
        for name in ANSWERED_WHEN_SET:
            if answer[name] is None:
                del answer[name]
        old = None if before is None else before.as_json()
        change = {name: [None if old is None else old[name], shown[name]] for name in fields}
        done = {"sku": sku, "created": before is None, "set": change}
        if unarchived:
            done["unarchived"] = True
        return answer, done

    async def _group_of(self, sku: str) -> str | None:
        """The limit group ``sku`` is in now (None: none, or no such sku)."""
        try:
            group = (await self._catalog.get(sku)).group
        except UnknownSku:
            return None
        return None if group is None else group.name

    async def _refuse_pending(self, sku: str) -> None:
        """Raise :class:`LimitGroupLocked` when ``sku`` has reservations pending
        in Redis (they are in its group's slot, which a change of group leaves)."""
        if await self._reservations.pending(sku):
            raise LimitGroupLocked("the sku has reservations pending: change its group after")

    async def _move(self, sku: str, after: SkuSettings) -> None:
        """``sku`` left its limit group for ``after``'s: its Redis state
        in the old slot goes (nothing of it is pending, no order of it is live),
        and the counter is loaded in the new slot, flagged as rebuilding, so the
        hashes are written again from the orders."""
        await self._reservations.drop_state(sku)
        self._reservations.tags.set(sku, after.limit_group)

    async def _announce_group(
        self, sku: str, before: SkuSettings | None, after: SkuSettings
    ) -> None:
        """Tell every instance that the skus of the groups ``sku`` left and joined
        changed: their catalog entries list the group's skus."""
        groups = {after.limit_group, None if before is None else before.limit_group} - {None}
        for group in groups:
            assert group is not None
            for member in (await self._groups.get(group)).skus:
                if member != sku:
                    self._catalog.forget(member)
                    await self._reservations.announce(member)
        # This sku's own announcement tells the others' key tags too.
        await self._reservations.announce(sku)

    async def archive(self, sku: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """Archive ``sku``: the API's answer (the same for every call) and what
        changed (``archived`` false when it already was). Raises :class:`UnknownSku`."""
        async with self._locks.held(sku):
            found = await self._inventory.archive(sku)
            if found is None:
                raise UnknownSku(f"no sku {sku!r}")
            archived_at, now = found
            if now:
                # Announced on the change feed: every instance's catalog drops it.
                await self._reservations.forget_stock(sku)
        self._forget(sku)
        answer = {"sku": sku, "status": "archived", "archived_at": rfc3339(archived_at)}
        return answer, {"sku": sku, "archived": now}

    async def skus(self, status: str, after: str, limit: int) -> dict[str, Any]:
        """A page of ``GET /admin/skus``: up to ``limit`` skus named after ``after``
        of ``status``, and the cursor of the next page (None on the last)."""
        found = await self._inventory.listing(status, after, limit + 1)
        page = found[:limit]
        shown = [
            {
                "sku": s.sku,
                "status": s.status,
                "stock": s.stock,
                "archived_at": None if s.archived_at is None else rfc3339(s.archived_at),
            }
            for s in page
        ]
        return {"skus": shown, "next": page[-1].sku if len(found) > limit else None}

    async def restock(self, sku: str, delta: int) -> dict[str, Any]:
        """Add ``delta`` units to ``sku``; raises :class:`UnknownSku`."""
        if not (await self._catalog.strategy(sku)).reserves:
            # No counter to keep in step: the row lock of the UPDATE is enough.
            stock = await self._inventory.restock(sku, delta)
            if stock is None:
                raise UnknownSku(f"no sku {sku!r}")
            return {"sku": sku, "stock": stock, "redis_stock": None}
        async with self._locks.held(sku):
            stock = await self._inventory.restock(sku, delta)
            if stock is None:
                raise UnknownSku(f"no sku {sku!r}")
            redis_stock = await self._reset(sku, stock)
        self._forget(sku)
        return {"sku": sku, "stock": stock, "redis_stock": redis_stock}

    async def _reset(self, sku: str, stock: int, *, fresh: bool = False) -> int:
        """Set the Redis counter; one set where it was missing (expired, lost, or
        never written under another strategy) flagged the sku as rebuilding, so
        take the rebuild unless another instance has (a no-op when not flagged).
        ``fresh``: the sku was created now, so it has no orders to rebuild."""
        mode = StockLoad.FRESH if fresh else StockLoad.RESET
        redis_stock = await self._reservations.load_stock(sku, stock, mode)
        if not fresh:
            self._rebuilds.ensure(sku)
        return redis_stock

    async def report(self, sku: str) -> StockReport:
        """Database stock, Redis stock, pending units and units sold of ``sku``."""
        db_stock = await self._orders.stock(sku)
        if db_stock is None:
            raise UnknownSku(f"no sku {sku!r}")
        sold = await self._orders.units_sold(sku)
        if not await self._sells_in_redis(sku):
            # Nothing of it in Redis: the report needs no Redis either.
            return StockReport(sku=sku, db_stock=db_stock, redis_stock=None, pending=0, sold=sold)
        pending = sum(p.qty for p in await self._reservations.pending(sku))
        return StockReport(
            sku=sku,
            db_stock=db_stock,
            redis_stock=await self._reservations.available(sku),
            pending=pending,
            sold=sold,
        )

    async def sheet(self, sku: str) -> dict[str, Any]:
        """``GET /admin/skus/{sku}``: every setting a ``PUT`` takes, as it takes
        it (a display field absent when not set; ``strategy`` and a rate null
        when the instance's default applies), so the settings put back change
        nothing; its status; and the counts: stock in PostgreSQL and Redis,
        pending, the units sold (``sold``) split into ``confirmed``,
        ``paid`` and ``held`` (pending payment), and the units refunded without
        restock, gone from the stock in no live order (``refunded_not_restocked``):
        ``db_stock`` plus those four is what the sku was given. Raises
        :class:`UnknownSku`."""
        found = await self._inventory.sheet(sku)
        if found is None:
            raise UnknownSku(f"no sku {sku!r}")
        report = await self.report(sku)
        settings, listing = found.settings, found.listing
        answer: dict[str, Any] = {
            "sku": sku,
            "status": listing.status,
            "archived_at": None if listing.archived_at is None else rfc3339(listing.archived_at),
            **settings.as_json(),
            "db_stock": report.db_stock,
            "redis_stock": report.redis_stock,
            "pending": report.pending,
            "sold": found.confirmed + found.paid + found.held,
            "confirmed": found.confirmed,
            "paid": found.paid,
            "held": found.held,
            "refunded_not_restocked": found.refunded_not_restocked,
        }
        for name in DISPLAY_FIELDS:
            if answer[name] is None:
                del answer[name]
        return answer

    async def display(self, sku: str) -> Display:
        """The display fields of ``sku`` (archived or not; none for a sku unknown)."""
        return await self._inventory.display(sku)

    async def _sells_in_redis(self, sku: str) -> bool:
        """Whether ``sku`` sells from a Redis counter; an archived sku (unknown to
        the catalog, still in the books) sells no more."""
        try:
            return (await self._catalog.strategy(sku)).reserves
        except UnknownSku:
            return False

    def _forget(self, sku: str) -> None:
        # This instance's own caches; the others learn from pub/sub.
        self._catalog.forget(sku)
        self._soldout.clear(sku)
