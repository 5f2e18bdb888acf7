"""The batcher: batches by size or wait, one flush per sku at a time, drains on close.

The flush here is a recording function: these tests check batching, not stock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from gateway.domain.errors import ShuttingDown, Unavailable
from gateway.domain.model import SOLD_OUT, Purchase, Result
from gateway.write.batcher import AfterEmpty, Batcher
from testkit.polling import wait_for


def purchase(i: int, sku: str = "s") -> Purchase:
    return Purchase(sku=sku, user_id=f"u{i}", qty=1, request_id=f"r{i}")


class Recorder:
    """A flush that records its batches and how many ran at once per sku."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[list[str]] = []
        self.running: dict[str, int] = {}
        self.most_at_once = 0
        self.delay = delay

    async def __call__(self, sku: str, batch: Sequence[Purchase]) -> list[Result | BaseException]:
        self.running[sku] = self.running.get(sku, 0) + 1
        self.most_at_once = max(self.most_at_once, self.running[sku])
        self.batches.append([p.request_id for p in batch])
        await asyncio.sleep(self.delay)
        self.running[sku] -= 1
        return [SOLD_OUT] * len(batch)


async def test_full_batches_flush_at_batch_max() -> None:
    """Ten purchases with batch_max 4 and a long wait flush as 4, 4 and then 2."""
    flush = Recorder()
    batcher = Batcher(flush, batch_max=4, batch_wait_s=0.05, backlog_max=100)
    results = await asyncio.gather(*(batcher.submit(purchase(i)) for i in range(10)))
    assert results == [SOLD_OUT] * 10
    assert [len(b) for b in flush.batches] == [4, 4, 2]
    assert [r for b in flush.batches for r in b] == [f"r{i}" for i in range(10)]
    await batcher.close()


async def test_one_flush_per_sku_at_a_time_and_next_fills_behind() -> None:
    """While a flush runs the next batch fills; no two flushes of a sku overlap."""
    flush = Recorder(delay=0.02)
    batcher = Batcher(flush, batch_max=3, batch_wait_s=0, backlog_max=100)
    await asyncio.gather(*(batcher.submit(purchase(i)) for i in range(9)))
    assert flush.most_at_once == 1
    assert sum(len(b) for b in flush.batches) == 9
    await batcher.close()


async def test_without_a_wait_batches_are_what_queued_behind_the_flush() -> None:
    """Natural batching (the default, batch_wait 0): the first buyer is flushed
    alone at once, and everyone who arrives while that flush runs goes into the
    next batch together, however they trickle in."""
    flush = Recorder(delay=0.5)
    batcher = Batcher(flush, batch_max=100, batch_wait_s=0, backlog_max=100)
    first = asyncio.ensure_future(batcher.submit(purchase(0)))
    await wait_for(lambda: bool(flush.batches), what="the first flush started", interval=0.001)
    rest = []
    for i in range(1, 10):
        rest.append(asyncio.ensure_future(batcher.submit(purchase(i))))
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(first, *rest), 5)
    assert flush.batches == [["r0"], [f"r{i}" for i in range(1, 10)]]
    await batcher.close()


async def test_flush_errors_reach_every_waiter() -> None:
    """A failing flush answers each of its purchases with the error."""

    async def failing(sku: str, batch: Sequence[Purchase]) -> list[Result | BaseException]:
        raise Unavailable("postgres down")

    batcher = Batcher(failing, batch_max=10, batch_wait_s=0, backlog_max=100)
    results = await asyncio.gather(
        *(batcher.submit(purchase(i)) for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, Unavailable) for r in results)
    assert batcher.backlog == 0
    await batcher.close()


async def test_close_drains_and_then_refuses() -> None:
    """close() flushes what is queued; afterwards submissions are refused and full is set."""
    flush = Recorder()
    batcher = Batcher(flush, batch_max=100, batch_wait_s=10, backlog_max=100)
    waiting = [asyncio.create_task(batcher.submit(purchase(i))) for i in range(5)]
    await asyncio.sleep(0)
    await batcher.close()
    assert [t.result() for t in waiting] == [SOLD_OUT] * 5
    assert batcher.full
    with pytest.raises(Unavailable):
        await batcher.submit(purchase(99))


async def test_queue_bound_reports_full() -> None:
    """At backlog_max queued purchases the batcher reports full (the caller sheds)."""
    flush = Recorder()
    batcher = Batcher(flush, batch_max=100, batch_wait_s=10, backlog_max=3)
    waiting = [asyncio.create_task(batcher.submit(purchase(i))) for i in range(3)]
    await asyncio.sleep(0)
    assert batcher.full
    await batcher.close()
    await asyncio.gather(*waiting)


async def test_abort_answers_every_waiting_purchase_and_stops_the_flushers() -> None:
    """A flush that never ends and a batch queued behind it: after close() runs out
    of time, abort() answers both batches' purchases ShuttingDown at once."""
    flush = Recorder(delay=3600)
    batcher = Batcher(flush, batch_max=2, batch_wait_s=0.0, backlog_max=100)
    waiting = [asyncio.ensure_future(batcher.submit(purchase(i))) for i in range(4)]
    await wait_for(lambda: batcher.backlog == 4 and bool(flush.batches), what="both batches queued")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await batcher.close()
    assert flush.batches == [["r0", "r1"]]
    batcher.abort()
    results = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 5)
    assert all(isinstance(r, ShuttingDown) for r in results), results
    await asyncio.wait_for(batcher.close(), 5)
    assert batcher.backlog == 0


async def test_the_flusher_hears_when_a_backlog_runs_empty() -> None:
    """on_empty is called for a sku once its backlog has nothing left to flush."""
    emptied: list[str] = []

    async def on_empty(sku: str, after: AfterEmpty) -> None:
        emptied.append(sku)

    batcher = Batcher(Recorder(), batch_max=4, batch_wait_s=0.0, backlog_max=100, on_empty=on_empty)
    await asyncio.gather(*(batcher.submit(purchase(i, "a")) for i in range(3)))
    await batcher.close()
    assert "a" in emptied


async def test_a_lone_buyer_is_not_held_for_the_batch_wait() -> None:
    """With nobody else arriving, a purchase is flushed at once, not after the
    30 s batch wait: at that pace no other purchase would join its batch."""
    flush = Recorder()
    batcher = Batcher(flush, batch_max=100, batch_wait_s=30, backlog_max=100)
    assert await asyncio.wait_for(batcher.submit(purchase(0)), 5) == SOLD_OUT
    assert flush.batches == [["r0"]]
    await batcher.close()


async def test_a_storm_fills_batches() -> None:
    """Purchases arriving back to back (one per loop turn) are held for the
    batch wait, so after the first few the batches flush full."""
    flush = Recorder()
    batcher = Batcher(flush, batch_max=5, batch_wait_s=1, backlog_max=100)
    waiting = []
    for i in range(40):
        waiting.append(asyncio.ensure_future(batcher.submit(purchase(i))))
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*waiting), 5)
    sizes = [len(b) for b in flush.batches]
    assert sum(sizes) == 40
    assert sizes.count(5) >= 5, sizes
    await batcher.close()


async def test_a_failing_empty_call_does_not_end_the_backlog() -> None:
    """The flusher's empty call (it releases the sku's lock) raising something
    unforeseen, as a lock release did in a Redis Cluster failover, is logged and
    the sku's backlog keeps flushing: before, its task died and every later
    purchase of the sku waited for good."""
    flush = Recorder()
    empty_calls: list[str] = []

    async def emptied(sku: str, after: AfterEmpty) -> None:
        empty_calls.append(sku)
        if len(empty_calls) == 1:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

    batcher = Batcher(flush, batch_max=4, batch_wait_s=0, backlog_max=100, on_empty=emptied)
    assert await batcher.submit(purchase(1)) == SOLD_OUT
    await wait_for(lambda: empty_calls, within=5, what="the backlog ran empty")
    async with asyncio.timeout(5):
        assert await batcher.submit(purchase(2)) == SOLD_OUT
    assert flush.batches == [["r1"], ["r2"]]
    await batcher.close()


async def test_the_backlog_calls_again_when_the_flusher_keeps_the_lock() -> None:
    """A flusher that keeps the sku's lock through an empty backlog says for how
    long; with nothing arriving the backlog calls it again then (the lock is let
    go in the backlog's own task), and on close it is told the backlog stops."""
    calls: list[AfterEmpty] = []

    async def emptied(sku: str, after: AfterEmpty) -> float | None:
        calls.append(after)
        return 0.01 if after is AfterEmpty.WAIT and len(calls) == 1 else None

    batcher = Batcher(Recorder(), batch_max=4, batch_wait_s=0, backlog_max=100, on_empty=emptied)
    assert await batcher.submit(purchase(1)) == SOLD_OUT
    await wait_for(lambda: len(calls) >= 2, within=5, what="the second empty call")
    assert calls[:2] == [AfterEmpty.WAIT, AfterEmpty.WAIT]
    await batcher.close()
    assert calls[-1] is AfterEmpty.END


@pytest.mark.parametrize("close_inside", [False, True])
async def test_closing_while_the_lock_is_kept_lets_it_go(close_inside: bool) -> None:
    """Closing a backlog whose flusher keeps the lock for a long while ends the
    backlog after telling the flusher, which lets go, not after the while; also
    when the closing began while the flusher was deciding to keep it."""
    calls: list[AfterEmpty] = []
    closing: list[asyncio.Future[None]] = []

    async def emptied(sku: str, after: AfterEmpty) -> float | None:
        calls.append(after)
        if close_inside and not closing:
            closing.append(asyncio.ensure_future(batcher.close()))
            await asyncio.sleep(0)  # the close begins
        return 60.0 if after is AfterEmpty.WAIT else None

    batcher = Batcher(Recorder(), batch_max=4, batch_wait_s=0, backlog_max=100, on_empty=emptied)
    assert await batcher.submit(purchase(1)) == SOLD_OUT
    await wait_for(lambda: calls, within=5, what="the backlog ran empty")
    await asyncio.wait_for(closing[0] if closing else batcher.close(), 5)
    assert calls == [AfterEmpty.WAIT, AfterEmpty.END]


class OnTheWay:
    """Reserve calls in flight, as ScriptCoalescer.on_the_way reports them."""

    def __init__(self) -> None:
        self.calls: list[asyncio.Future[None]] = []

    def __call__(self, sku: str) -> list[asyncio.Future[None]] | None:
        flying = [c for c in self.calls if not c.done()]
        return flying or None


def landing(flush: Recorder, on_the_way: OnTheWay, landing_s: float) -> Batcher:
    """A batcher told of the purchases on their way, waiting for them ``landing_s``."""
    return Batcher(
        flush,
        batch_max=100,
        batch_wait_s=0,
        backlog_max=100,
        on_the_way=on_the_way,
        landing_s=landing_s,
    )


async def test_a_batch_waits_for_the_purchases_on_their_way() -> None:
    """Buyers whose reservation is in flight when their sku's flush starts join
    its batch: three arrive, five more are on their way, one flush of eight."""
    flush = Recorder()
    on_the_way = OnTheWay()
    batcher = landing(flush, on_the_way, 30)
    call: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    on_the_way.calls.append(call)

    async def reserved_then_submit(i: int) -> Result:
        await call  # Redis answers the reserve call
        return await batcher.submit(purchase(i))

    late = [asyncio.ensure_future(reserved_then_submit(i)) for i in range(3, 8)]
    early = [asyncio.ensure_future(batcher.submit(purchase(i))) for i in range(3)]
    await wait_for(lambda: batcher.backlog == 3, within=5, what="three queued")
    call.set_result(None)
    await asyncio.wait_for(asyncio.gather(*early, *late), 5)
    assert flush.batches == [[f"r{i}" for i in range(8)]]
    await batcher.close()


async def test_a_batch_waits_for_purchases_on_their_way_only_so_long() -> None:
    """A reserve call that does not come back holds no batch past the landing
    bound: the purchases already queued are flushed."""
    flush = Recorder()
    on_the_way = OnTheWay()
    batcher = landing(flush, on_the_way, 0.05)
    stuck: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    on_the_way.calls.append(stuck)
    results = await asyncio.wait_for(
        asyncio.gather(*(batcher.submit(purchase(i)) for i in range(3))), 5
    )
    assert results == [SOLD_OUT] * 3
    assert flush.batches == [["r0", "r1", "r2"]]
    stuck.cancel()
    await batcher.close()
