"""The rebuild's pacing against its lease, with the loop's CPU clock, the pause
and the lease's clock played by the test: a saturated loop slows the rebuild
down but never makes it lose its lease (``gateway.usecases.rebuilds``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from gateway.domain.stock import OrderPage
from gateway.postgres.orders import Orders
from gateway.redis.rebuild_lease import RebuildLease
from gateway.usecases.rebuilds import LEASE_MS, MAX_PAUSE_S, Rebuilds
from testkit.polling import wait_for

PAGE = 10
PAGES = 5


class Loop:
    """The loop's clocks: its thread's CPU time and the wall clock (as Redis's
    TIME sees it), both advanced by the test's page reads and pauses."""

    def __init__(self, cpu_per_page: float) -> None:
        self.cpu = 0.0
        self.wall = 0.0
        self.cpu_per_page = cpu_per_page
        self.pauses: list[float] = []

    def cpu_clock(self) -> float:
        return self.cpu

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.wall += seconds


class Pages:
    """``PAGES`` full pages of orders and an empty one; each read takes the
    loop's CPU for ``cpu_per_page`` (the buyers' work it ran meanwhile), which on a
    saturated loop is as much wall time."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.read = 0

    async def order_page(self, sku: str, after_user: str, limit: int) -> OrderPage:
        self.loop.cpu += self.loop.cpu_per_page
        self.loop.wall += self.loop.cpu_per_page
        self.read += 1
        if self.read > PAGES:
            return OrderPage([], after_user, 0)
        users = [f"u{self.read:02d}{i:02d}" for i in range(limit)]
        fields = [field for user in users for field in (f"r-{user}", f"o|{user}|1", user)]
        return OrderPage(fields, users[-1], limit)


class Lease:
    """rebuild.lua's lease on the test's wall clock, taken over as another
    instance would once it ran out: a write after that is refused."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.until = 0.0
        self.written = 0
        self.finished = False

    async def take(self, sku: str, owner: str, lease_ms: int) -> bool:
        self.until = self.loop.wall + lease_ms / 1000
        return True

    async def write(self, sku: str, owner: str, lease_ms: int, fields: Sequence[str]) -> bool:
        if self.loop.wall > self.until:
            return False
        self.written += len(fields) // 3
        self.until = self.loop.wall + lease_ms / 1000
        return True

    async def finish(self, sku: str, owner: str) -> bool:
        self.finished = self.loop.wall <= self.until
        return self.finished


async def rebuild(cpu_per_page: float, share: float) -> tuple[Loop, Lease]:
    loop = Loop(cpu_per_page)
    lease = Lease(loop)
    rebuilds = Rebuilds(
        cast(RebuildLease, lease),
        cast(Orders, Pages(loop)),
        share=share,
        page=PAGE,
        cpu_clock=loop.cpu_clock,
        sleep=loop.sleep,
    )
    rebuilds.ensure("s")
    await wait_for(lambda: not rebuilds.running("s"), what="the rebuild ends")
    return loop, lease


async def test_a_page_pauses_for_the_loop_cpu_beyond_the_share() -> None:
    """With 10 ms of loop CPU a page and a share of a tenth, each page but the
    last pauses 90 ms, and every order is written."""
    loop, lease = await rebuild(0.01, 0.1)
    assert [round(p, 6) for p in loop.pauses] == [0.09] * PAGES
    assert (lease.written, lease.finished) == (PAGE * PAGES, True)


async def test_a_saturated_loop_never_pauses_the_rebuild_past_its_lease() -> None:
    """Pages during which a saturated loop spent 5 s of CPU would ask for 45 s
    pauses, past the 10 s lease (another instance would take the rebuild over
    from the first page, again and again): each pause is a quarter of the lease,
    the lease holds from the first write to the end, every order is written."""
    loop, lease = await rebuild(5.0, 0.1)
    assert (lease.written, lease.finished) == (PAGE * PAGES, True)
    assert loop.pauses == [MAX_PAUSE_S] * PAGES
    assert MAX_PAUSE_S == LEASE_MS / 1000 / 4
