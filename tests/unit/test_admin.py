"""The stock administration decided against fakes (issue 39): ``StockAdmin``
takes the Protocols of ``gateway.usecases.ports``, so inventory rows and a
counter in memory show what each change does to Redis: a change resets the
counter to the database's stock less what is pending, a strategy without Redis
state loses its counter, an unknown sku is refused, and archiving is done once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.domain.errors import UnknownSku
from gateway.domain.model import Display, LimitGroup, SkuInfo, SkuSettings, Strategy
from gateway.domain.skus import IfMissing, SkuChange, SkuListing, SkuSheet
from gateway.domain.stock import StockLoad
from gateway.settings import Settings
from gateway.usecases.admin import StockAdmin
from gateway.usecases.catalog import Catalog
from gateway.usecases.servable import Servability
from gateway.usecases.sold_out import ConfirmedIds, SoldOut
from tests.unit.stock_fakes import SKU, Locks, Rebuilds, Redis, Tags

ARCHIVED_AT = datetime(2030, 1, 1, tzinfo=UTC)


@dataclass
class Rows:
    """The inventory rows: each sku's settings, and when it was archived."""

    skus: dict[str, SkuSettings] = field(default_factory=dict)
    archived: set[str] = field(default_factory=set)

    async def sku_info(self, sku: str) -> SkuInfo | None:
        found = self.skus.get(sku)
        return None if found is None or sku in self.archived else found.info(sku)

    async def change_sku(
        self, sku: str, fields: Mapping[str, Any], *, if_missing: IfMissing
    ) -> SkuChange | None:
        before = self.skus.get(sku)
        if before is None and if_missing is IfMissing.REFUSE:
            return None
        after = replace(before or SkuSettings(), **fields)
        self.skus[sku] = after
        unarchived = if_missing is IfMissing.CREATE and sku in self.archived
        self.archived.discard(sku)
        return SkuChange(before, after, unarchived)

    async def restock(self, sku: str, delta: int) -> int | None:
        found = self.skus.get(sku)
        if found is None:
            return None
        self.skus[sku] = replace(found, stock=found.stock + delta)
        return found.stock + delta

    async def archive(self, sku: str) -> tuple[datetime, bool] | None:
        if sku not in self.skus:
            return None
        now = sku not in self.archived
        self.archived.add(sku)
        return ARCHIVED_AT, now

    async def listing(self, status: str, after: str, limit: int) -> list[SkuListing]:
        return []

    async def sheet(self, sku: str) -> SkuSheet | None:
        return None

    async def display(self, sku: str) -> Display:
        return Display()

    async def stock(self, sku: str) -> int | None:
        found = self.skus.get(sku)
        return None if found is None else found.stock

    async def units_sold(self, sku: str) -> int:
        return 0

    async def orders(self, request_ids: object) -> dict[str, Any]:
        return {}

    async def release_stale(self, sku: str, stale: object) -> dict[str, Any]:
        return {}

    async def stock_and_owed(self, sku: str) -> tuple[int, dict[str, int]] | None:
        return None

    async def waiting_room_skus(self, limit: int) -> list[str]:
        return []

    async def bot_check_skus(self, limit: int) -> list[str]:
        return []


class Groups:
    """No limit groups."""

    async def put(self, name: str, per_user_limit: int) -> tuple[int | None, LimitGroup]:
        raise AssertionError("no group is put here")

    async def get(self, name: str) -> LimitGroup:
        raise AssertionError("no group is read here")

    async def delete(self, name: str) -> None:
        raise AssertionError("no group is deleted here")

    async def grouped_skus(self) -> dict[str, str]:
        return {}


@dataclass
class World:
    rows: Rows
    redis: Redis
    rebuilds: Rebuilds
    soldout: SoldOut
    admin: StockAdmin


@pytest.fixture
def world() -> World:
    """A sku of 10 units under the default strategy, its counter in step."""
    rows, redis, rebuilds, soldout = Rows(), Redis(), Rebuilds(), SoldOut()
    rows.skus[SKU] = SkuSettings(stock=10)
    redis.counters[SKU] = 10
    catalog = Catalog(rows, Strategy.RESERVE_BATCH, Tags())
    admin = StockAdmin(
        reservations=redis,
        orders=rows,
        inventory=rows,
        locks=Locks(),
        catalog=catalog,
        soldout=soldout,
        servability=Servability(Settings(), rows),
        rebuilds=rebuilds,
        groups=Groups(),
    )
    return World(rows, redis, rebuilds, soldout, admin)


class TestChanges:
    """A change writes the row, then sets the counter from it."""

    async def test_a_change_resets_the_counter_less_what_is_pending(self, world: World) -> None:
        """A PATCH of the stock loads the counter (RESET) with the database's
        stock less the units pending, takes the rebuild a missing counter
        flagged, and clears this instance's sold-out mark."""
        world.redis.reserve("r-1", 2)
        world.soldout.mark(SKU, world.soldout.generation(SKU), ConfirmedIds(0))
        answer, done = await world.admin.change_sku(SKU, {"stock": 20}, if_missing=IfMissing.REFUSE)
        assert world.redis.loads == [(SKU, 20, StockLoad.RESET)]
        assert (answer["redis_stock"], answer["stock"]) == (18, 20)
        assert done == {"sku": SKU, "created": False, "set": {"stock": [10, 20]}}
        assert world.rebuilds.started == [SKU]
        assert world.soldout.lookup(SKU) is None

    async def test_a_sku_created_loads_a_fresh_counter(self, world: World) -> None:
        """A PUT of a new sku loads its counter FRESH: no orders to rebuild."""
        answer, done = await world.admin.change_sku(
            "new", {"stock": 5}, if_missing=IfMissing.CREATE
        )
        assert world.redis.loads == [("new", 5, StockLoad.FRESH)]
        assert (answer["redis_stock"], done["created"], world.rebuilds.started) == (5, True, [])

    async def test_a_strategy_without_redis_state_deletes_the_counter(self, world: World) -> None:
        """Moved to a strategy that decides in PostgreSQL alone, the sku's counter
        goes and nothing is loaded; a restock then touches the database alone."""
        answer, _ = await world.admin.change_sku(
            SKU, {"strategy": Strategy.SQL_DIRECT}, if_missing=IfMissing.REFUSE
        )
        assert (answer["strategy"], answer["redis_stock"]) == ("sql-direct", None)
        assert SKU not in world.redis.counters
        restocked = await world.admin.restock(SKU, 3)
        assert restocked == {"sku": SKU, "stock": 13, "redis_stock": None}
        assert world.redis.loads == []

    async def test_an_unknown_sku_is_refused(self, world: World) -> None:
        """A PATCH, a restock and a report of a sku that does not exist raise
        UnknownSku, and Redis is not touched."""
        with pytest.raises(UnknownSku):
            await world.admin.change_sku("nope", {"stock": 1}, if_missing=IfMissing.REFUSE)
        with pytest.raises(UnknownSku):
            await world.admin.restock("nope", 1)
        with pytest.raises(UnknownSku):
            await world.admin.report("nope")
        assert world.redis.loads == []


class TestArchive:
    """DELETE /admin/skus/{sku}: retired once, orders kept."""

    async def test_archiving_forgets_the_counter_once(self, world: World) -> None:
        """The first archive drops the counter and the catalog entry; a second
        answers the same and changes nothing; a PUT lists the sku again."""
        answer, done = await world.admin.archive(SKU)
        assert answer == {
            "sku": SKU,
            "status": "archived",
            "archived_at": "2030-01-01T00:00:00.000Z",
        }
        assert done == {"sku": SKU, "archived": True}
        assert SKU not in world.redis.counters
        world.redis.counters[SKU] = 0  # left alone by the second call
        again, done = await world.admin.archive(SKU)
        assert (again, done) == (answer, {"sku": SKU, "archived": False})
        assert world.redis.counters[SKU] == 0
        _, listed = await world.admin.change_sku(SKU, {"stock": 4}, if_missing=IfMissing.CREATE)
        assert listed["unarchived"] is True

    async def test_an_unknown_sku_cannot_be_archived(self, world: World) -> None:
        """Archiving a sku that never existed raises UnknownSku."""
        with pytest.raises(UnknownSku):
            await world.admin.archive("nope")
