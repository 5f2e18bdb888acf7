"""The limit groups' use cases against fakes of their collaborators
(gateway.usecases.limit_groups, gateway.usecases.group_tags), and the pure
pieces: a grouped sku's keys, the verdict L, the refusal's body."""

from __future__ import annotations

import pytest

from gateway.domain.errors import GroupInUse, GroupLimitReached, NoLimitGroup, Unavailable
from gateway.domain.model import LimitGroup, Verdict
from gateway.redis.layout import KeyTags, SkuKeys
from gateway.usecases.group_tags import GroupTags
from gateway.usecases.limit_groups import LimitGroupsAdmin


class FakeStore:
    """Groups in a dict; skus named by a dict of sku -> group."""

    def __init__(self) -> None:
        self.limits: dict[str, int] = {}
        self.skus: dict[str, str] = {}
        self.fail = False

    async def put(self, name: str, per_user_limit: int) -> tuple[int | None, LimitGroup]:
        before = self.limits.get(name)
        self.limits[name] = per_user_limit
        return before, await self.get(name)

    async def get(self, name: str) -> LimitGroup:
        if name not in self.limits:
            raise NoLimitGroup(name)
        members = tuple(sorted(s for s, g in self.skus.items() if g == name))
        return LimitGroup(name, self.limits[name], members)

    async def delete(self, name: str) -> None:
        group = await self.get(name)
        if group.skus:
            raise GroupInUse(name)
        del self.limits[name]

    async def grouped_skus(self) -> dict[str, str]:
        if self.fail:
            raise Unavailable("postgres down")
        return dict(self.skus)


class Recorder:
    """The announcer and the catalog: what each was told."""

    def __init__(self) -> None:
        self.announced: list[str] = []
        self.forgotten: list[str] = []

    async def announce(self, sku: str) -> None:
        self.announced.append(sku)

    def forget(self, sku: str) -> None:
        self.forgotten.append(sku)


def admin_of(store: FakeStore) -> tuple[LimitGroupsAdmin, Recorder]:
    seen = Recorder()
    return LimitGroupsAdmin(store=store, announcer=seen, catalog=seen), seen


async def test_a_new_limit_is_announced_for_every_sku_of_the_group() -> None:
    """A group's limit is in each of its skus' catalog entries: a change of it
    drops them here and on every instance; the same limit again changes nothing."""
    store = FakeStore()
    store.skus = {"shoe-42": "drop", "shoe-43": "drop", "hat": "other"}
    admin, seen = admin_of(store)
    answer, done = await admin.put("drop", 1)
    assert answer == {"group": "drop", "per_user_limit": 1, "skus": ["shoe-42", "shoe-43"]}
    assert done == {"group": "drop", "created": True, "set": {"per_user_limit": [None, 1]}}
    assert seen.announced == seen.forgotten == ["shoe-42", "shoe-43"]
    await admin.put("drop", 1)
    assert seen.announced == ["shoe-42", "shoe-43"]


async def test_a_group_in_use_is_not_deleted() -> None:
    """DELETE refuses a group a sku names (group_in_use); an unknown one is 404."""
    store = FakeStore()
    store.skus = {"shoe-42": "drop"}
    admin, _ = admin_of(store)
    await admin.put("drop", 2)
    with pytest.raises(GroupInUse):
        await admin.delete("drop")
    store.skus.clear()
    assert (await admin.delete("drop"))[0] == {"group": "drop", "deleted": True}
    with pytest.raises(NoLimitGroup):
        await admin.get("drop")


async def test_the_tags_follow_postgres_and_survive_its_absence() -> None:
    """GroupTags loads every grouped sku's group, reads again when a sku
    changed, and keeps what it knew while PostgreSQL cannot be read."""
    store, tags = FakeStore(), KeyTags()
    store.skus = {"shoe-42": "drop"}
    group_tags = GroupTags(tags=tags, store=store)
    await group_tags.load()
    assert tags.group_of("shoe-42") == "drop"
    store.skus = {"shoe-43": "drop"}
    group_tags.sku_changed("shoe-43")
    await group_tags.reloaded()
    assert (tags.group_of("shoe-42"), tags.group_of("shoe-43")) == (None, "drop")
    store.fail = True
    group_tags.feed_resumed()
    await group_tags.reloaded()
    assert tags.group_of("shoe-43") == "drop"
    await group_tags.close()


def test_a_grouped_skus_keys_share_the_groups_slot() -> None:
    """Every key of a grouped sku carries the group's tag, apart from another
    group's and from an ungrouped sku's {sku} tag."""
    grouped = SkuKeys.of("p", "shoe-42", "drop")
    assert {k.split("}")[0] for k in (*grouped.all(), grouped.rebuild)} == {"p:{g:drop"}
    assert SkuKeys.of("p", "shoe-42").stock == "p:{shoe-42}:stock"
    assert KeyTags({"shoe-42": "drop"}).base("p", "shoe-42") == "p:{g:drop}:shoe-42"


def test_a_refusal_past_the_group_is_settled_as_released() -> None:
    """Verdict L gives its units and buyer back in Redis (settle.lua's R), and
    the answer names the group."""
    assert Verdict.GROUP_LIMIT.settled_as is Verdict.RELEASED
    assert GroupLimitReached("drop").body() == {
        "status": "group_limit_reached",
        "limit_group": "drop",
    }
    assert GroupLimitReached("drop").status == 409
