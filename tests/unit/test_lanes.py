"""The host's lanes: which worker owns a sku, and passing purchases to it.

Two :class:`HostLanes` (worker 0 and worker 1 of two) talk over real Unix
sockets in a temporary directory, each in front of a real :class:`Batcher`.
The batchers' flush functions are test doubles that answer what a test tells
them: these tests check the link between workers, not stock.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from gateway.domain.errors import (
    GatewayError,
    IdempotencyMismatch,
    NotStarted,
    OutcomeUnknown,
    RateLimited,
    Unavailable,
)
from gateway.domain.model import Order, Outcome, Purchase, Result
from gateway.write import frames
from gateway.write.batcher import Batcher
from gateway.write.lanes import RECONNECT_S, HostLanes, owner_of
from testkit.polling import wait_for


# Each gateway error class, and a value of each argument their constructors take.
def every_error(cls: type[GatewayError] = GatewayError) -> list[type[GatewayError]]:
    return [cls, *(s for sub in cls.__subclasses__() for s in every_error(sub))]


ARGUMENTS: dict[str, Any] = {
    "detail": "why",
    "headers": {"X-Why": "a test"},
    "retry_after": 3,
    "request_id": "r1",
    "starts_at": "2030-01-01T00:00:00Z",
    "ms_to_start": 2500,
    "ms_to_a_token": 1200,
    "limit_group": "shoes",
}

# A sku of each worker of two.
OWNED_BY_1 = next(f"sku-{i}" for i in range(100) if owner_of(f"sku-{i}", 2) == 1)
OWNED_BY_0 = next(f"sku-{i}" for i in range(100) if owner_of(f"sku-{i}", 2) == 0)


def purchase(i: int, sku: str = OWNED_BY_1) -> Purchase:
    return Purchase(sku=sku, user_id=f"u{i}", qty=1, request_id=f"r{i}", reserved_at_ms=1000 + i)


def confirmed(p: Purchase) -> Result:
    order = Order(f"order-{p.request_id}", p.request_id, p.sku, p.user_id, p.qty)
    return Result(Outcome.CONFIRMED, order, p.request_id)


@dataclass
class Flush:
    """A worker's flush: records the purchases it got and answers each by
    ``answer`` (a result or an exception), after ``gate`` opens if one is set."""

    answer: dict[str, Result | BaseException] = field(default_factory=dict)
    flushed: list[Purchase] = field(default_factory=list)
    gate: asyncio.Event | None = None
    entered: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, sku: str, batch: Sequence[Purchase]) -> list[Result | BaseException]:
        self.flushed += batch
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        return [self.answer.get(p.request_id, confirmed(p)) for p in batch]


class Observer:
    """The lane metrics' test double: counts by what they were told."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def passed(self, count: int) -> None:
        self.counts["passed"] += count

    def kept(self, reason: str) -> None:
        self.counts[reason] += 1

    def linked(self, change: int) -> None:
        self.counts["links"] += change


async def linked(passer: HostLanes, owner: Flush, within: float) -> None:
    """Submit purchases of the owner's sku until one reaches the owner's flush."""
    tries = iter(range(1000, 2000))

    async def passed() -> bool:
        await passer.submit(purchase(next(tries)))
        return bool(owner.flushed)

    await wait_for(passed, within=within, what="a link to the owner")


@dataclass
class Worker:
    """One worker's batcher and lanes, as gateway.app wires them."""

    flush: Flush
    batcher: Batcher
    lanes: HostLanes
    observer: Observer


@contextlib.asynccontextmanager
async def worker(directory: Path, index: int, *, start: bool = True) -> AsyncIterator[Worker]:
    flush, observer = Flush(), Observer()
    batcher = Batcher(flush, batch_max=64, batch_wait_s=0, backlog_max=100)
    lanes = HostLanes(
        batcher, directory=str(directory), index=index, count=2, backlog_max=100, observer=observer
    )
    if start:
        await lanes.start()
    try:
        yield Worker(flush, batcher, lanes, observer)
    finally:
        if flush.gate is not None:
            flush.gate.set()
        await batcher.close()
        await lanes.close()


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Worker, Worker]]:
    """Workers 0 and 1 of a host, both listening, worker 0 linked to worker 1
    (a link opens on a worker's first purchase of another's sku), and what the
    linking flushed and counted forgotten."""
    async with worker(tmp_path, 0) as w0, worker(tmp_path, 1) as w1:
        await linked(w0.lanes, w1.flush, within=5)
        for w in (w0, w1):
            w.flush.flushed.clear()
            w.flush.entered.clear()
            w.observer.counts.clear()
        yield w0, w1


def test_owner_of_is_the_same_in_every_process_and_spreads_skus() -> None:
    """A sku's owner is fixed (crc32, not Python's salted hash: every worker of a
    host must agree), within range, and 4000 skus spread evenly over 4 workers."""
    assert [owner_of("flash", n) for n in (1, 2, 3, 4)] == [0, 1, 2, 3]
    spread = Counter(owner_of(f"sku-{i}", 4) for i in range(4000))
    assert set(spread) == {0, 1, 2, 3}
    assert all(900 < n < 1100 for n in spread.values()), spread


async def test_a_purchase_of_anothers_sku_is_flushed_by_its_owner(
    pair: tuple[Worker, Worker],
) -> None:
    """Worker 0's purchase of worker 1's sku is flushed in worker 1's batch, and
    its result (with its order) comes back whole; worker 0 flushes nothing."""
    w0, w1 = pair
    p = purchase(1)
    assert await w0.lanes.submit(p) == confirmed(p)
    assert w1.flush.flushed == [p]
    assert w0.flush.flushed == []
    assert w1.observer.counts == {"passed": 1}


async def test_a_purchase_of_its_own_sku_stays_in_the_worker(pair: tuple[Worker, Worker]) -> None:
    """A worker flushes the skus it owns itself."""
    w0, w1 = pair
    p = purchase(1, sku=OWNED_BY_0)
    assert await w0.lanes.submit(p) == confirmed(p)
    assert w0.flush.flushed == [p]
    assert w1.flush.flushed == []


async def test_results_without_an_order_come_back_as_flushed(pair: tuple[Worker, Worker]) -> None:
    """Sold out, duplicate and accepted (its request id to follow) round-trip."""
    w0, w1 = pair
    answers = {
        "r1": Result(Outcome.SOLD_OUT),
        "r2": Result(Outcome.DUPLICATE),
        "r3": Result(Outcome.ACCEPTED, None, "r3"),
    }
    w1.flush.answer.update(answers)
    results = await asyncio.gather(*(w0.lanes.submit(purchase(i)) for i in (1, 2, 3)))
    assert results == list(answers.values())


@pytest.mark.parametrize(
    "error",
    [
        IdempotencyMismatch("r1"),
        Unavailable("postgres down", retry_after=3),
        OutcomeUnknown("the flush's connection broke"),
        NotStarted("2030-01-01T00:00:00Z", 2500),
        RateLimited(1200),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_the_owners_error_reaches_the_buyer_as_raised(
    pair: tuple[Worker, Worker], error: GatewayError
) -> None:
    """A gateway error of the owner's flush comes back of the same class, with
    its status, code, detail, body and headers (a Retry-After survives)."""
    w0, w1 = pair
    w1.flush.answer["r1"] = error
    with pytest.raises(GatewayError) as caught:
        await w0.lanes.submit(purchase(1))
    got = caught.value
    assert type(got) is type(error)
    assert (got.status, got.code, got.detail, got.headers) == (
        error.status,
        error.code,
        error.detail,
        error.headers,
    )
    assert got.body() == error.body()


async def test_an_unexpected_flush_failure_answers_unavailable(
    pair: tuple[Worker, Worker],
) -> None:
    """Anything but a gateway error from the owner's flush reaches the buyer as
    503 ``unavailable``, not as a crash of the link; the next purchase passes."""
    w0, w1 = pair
    w1.flush.answer["r1"] = RuntimeError("a bug in the flush")
    with pytest.raises(Unavailable) as caught:
        await w0.lanes.submit(purchase(1))
    assert (caught.value.status, caught.value.code) == (503, "unavailable")
    assert await w0.lanes.submit(purchase(2)) == confirmed(purchase(2))


async def test_a_draining_owner_leaves_the_purchase_to_the_passer(
    pair: tuple[Worker, Worker],
) -> None:
    """The owner's batcher is closed (it drains): it answers ShuttingDown before
    taking the purchase, so the worker that reserved it flushes it itself."""
    w0, w1 = pair
    p = purchase(1)
    await w1.batcher.close()
    assert await w0.lanes.submit(p) == confirmed(p)
    assert w0.flush.flushed == [p]
    assert w1.flush.flushed == []
    assert w0.observer.counts["draining"] == 1


async def test_an_owner_not_listening_yet_is_reached_once_it_listens(tmp_path: Path) -> None:
    """Worker 1 is not listening: worker 0 flushes its purchases itself
    (``unreachable``). Once worker 1 listens, worker 0 reconnects within a few
    RECONNECT_S and passes the purchases on again."""
    async with worker(tmp_path, 0) as w0, worker(tmp_path, 1, start=False) as w1:
        p = purchase(0)
        assert await w0.lanes.submit(p) == confirmed(p)
        assert w0.flush.flushed == [p]
        assert w0.observer.counts["unreachable"] == 1
        await w1.lanes.start()
        await linked(w0.lanes, w1.flush, within=4 * RECONNECT_S + 1)
        assert w1.observer.counts["passed"] == 1


async def test_workers_link_as_they_start_before_any_purchase(tmp_path: Path) -> None:
    """Worker 0 starts before worker 1 listens (workers start in any order):
    once worker 1 listens both are linked within a few RECONNECT_S, with no
    purchase needed, so a sale's very first purchase of worker 1's sku is
    passed to it, not kept."""
    async with worker(tmp_path, 0) as w0, worker(tmp_path, 1, start=False) as w1:
        assert not w0.lanes.linked
        await w1.lanes.start()

        def both_linked() -> bool:
            return w0.observer.counts["links"] == 1 and w1.observer.counts["links"] == 1

        await wait_for(both_linked, within=4 * RECONNECT_S + 1, what="both workers linked")
        await wait_for(lambda: w0.lanes.linked and w1.lanes.linked, what="linked reported")
        p = purchase(0)
        assert await w0.lanes.submit(p) == confirmed(p)
        assert w1.flush.flushed == [p]
        assert w0.observer.counts["unreachable"] == 0


async def test_a_link_lost_with_purchases_passed_answers_outcome_unknown(
    pair: tuple[Worker, Worker],
) -> None:
    """Worker 1 stops listening and drops its links while it flushes a purchase
    worker 0 passed: worker 0 cannot know whether it committed, so its buyer gets
    OutcomeUnknown (503; the reservation stays for the reconciler). The next
    purchase, worker 1 gone, is flushed by worker 0 itself. Worker 0 stays
    ready (issue 42's "lanes": false seen once): readiness waits for a worker's
    first links alone, so only a worker starting (or restarted) answers it,
    never one whose link dropped."""
    w0, w1 = pair
    await wait_for(lambda: w0.lanes.linked, within=4 * RECONNECT_S + 1, what="linked reported")
    w1.flush.gate = asyncio.Event()
    passed = asyncio.create_task(w0.lanes.submit(purchase(1)))
    await asyncio.wait_for(w1.flush.entered.wait(), 5)
    await w1.lanes.close()
    with pytest.raises(OutcomeUnknown) as caught:
        await asyncio.wait_for(passed, 5)
    assert w0.lanes.linked, "a lost link made the worker unready"
    assert (caught.value.status, caught.value.code) == (503, "unavailable")
    p = purchase(2)
    assert await w0.lanes.submit(p) == confirmed(p)
    assert w0.flush.flushed == [p]


async def test_a_purchase_the_owner_gave_up_mid_flush_is_not_flushed_again(
    pair: tuple[Worker, Worker],
) -> None:
    """Worker 1's drain runs out of time (``Batcher.abort``) while it flushes a
    purchase worker 0 passed: the flush may have committed, so worker 0 must not
    take it for "not taken" and flush it again; its buyer gets OutcomeUnknown."""
    w0, w1 = pair
    w1.flush.gate = asyncio.Event()
    passed = asyncio.create_task(w0.lanes.submit(purchase(1)))
    await asyncio.wait_for(w1.flush.entered.wait(), 5)
    w1.batcher.abort()
    with pytest.raises(OutcomeUnknown):
        await asyncio.wait_for(passed, 5)
    assert w0.flush.flushed == []


async def test_a_lost_link_is_logged_without_the_bindings_of_the_request_that_opened_it(
    tmp_path: Path,
) -> None:
    """The link opens during some buyer's request; when it is lost later, with
    another buyer's purchase passed, the warning names the owner and how many
    were passed, not the request id of the buyer who happened to open it."""
    async with worker(tmp_path, 0) as w0, worker(tmp_path, 1) as w1:
        structlog.contextvars.bind_contextvars(request_id="opener")
        try:
            await linked(w0.lanes, w1.flush, within=5)
        finally:
            structlog.contextvars.unbind_contextvars("request_id")
        w1.flush.gate = asyncio.Event()
        passed = asyncio.create_task(w0.lanes.submit(purchase(1)))
        await asyncio.wait_for(w1.flush.entered.wait(), 5)
        with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
            await w1.lanes.close()
            with pytest.raises(OutcomeUnknown):
                await asyncio.wait_for(passed, 5)
        (lost,) = [e for e in logs if e["event"] == "lane_lost"]
        assert (lost["owner"], lost["passed"]) == (1, 1)
        assert "request_id" not in lost, lost


async def test_a_cancelled_passer_leaves_the_other_answers_right(
    pair: tuple[Worker, Worker],
) -> None:
    """Of three purchases passed together, the buyer of the second goes away
    (its handler is cancelled): the other two get their own results, and so
    does a purchase passed after the late answer came back to nobody."""
    w0, w1 = pair
    w1.flush.gate = asyncio.Event()
    tasks = [asyncio.create_task(w0.lanes.submit(purchase(i))) for i in (1, 2, 3)]
    await asyncio.wait_for(w1.flush.entered.wait(), 5)
    tasks[1].cancel()
    w1.flush.gate.set()
    assert await asyncio.wait_for(tasks[0], 5) == confirmed(purchase(1))
    assert await asyncio.wait_for(tasks[2], 5) == confirmed(purchase(3))
    assert tasks[1].cancelled()
    assert [p.request_id for p in w1.flush.flushed] == ["r1", "r2", "r3"]
    assert await w0.lanes.submit(purchase(4)) == confirmed(purchase(4))


async def test_purchases_awaiting_the_owner_count_against_the_backlog(tmp_path: Path) -> None:
    """What a worker passed on and awaits counts in its own bound: with a backlog
    of 2, two purchases held by the owner make the passer full."""
    async with worker(tmp_path, 1) as w1:
        flush0 = Flush()
        batcher0 = Batcher(flush0, batch_max=64, batch_wait_s=0, backlog_max=2)
        lanes0 = HostLanes(
            batcher0, directory=str(tmp_path), index=0, count=2, backlog_max=2, observer=Observer()
        )
        await lanes0.start()
        try:
            await linked(lanes0, w1.flush, within=5)
            w1.flush.gate = asyncio.Event()
            tasks = [asyncio.create_task(lanes0.submit(purchase(i))) for i in (1, 2)]
            await wait_for(lambda: lanes0.full, within=5, what="the passer full")
            assert batcher0.backlog == 0
            w1.flush.gate.set()
            await asyncio.gather(*tasks)
            assert not lanes0.full
        finally:
            await batcher0.close()
            await lanes0.close()


class TestFrames:
    """What workers pass each other keeps every field, in the order its class
    gives on both sides, and a frame whose fields are not its class's is
    refused rather than read into other fields."""

    def test_a_purchase_and_its_answer_keep_every_field(self) -> None:
        """A purchase, a result with its order and one without come back equal."""
        p = purchase(7)
        assert frames.purchase_of(frames.read(frames.purchase_frame(3, p))) == p
        for result in (confirmed(p), Result(Outcome.ACCEPTED, None, "r7")):
            frame = frames.read(frames.result_frame(3, result))
            assert frames.is_result(frame)
            assert (frame[0], frames.result_of(frame)) == (3, result)

    @pytest.mark.parametrize("change", ["added", "dropped"])
    @pytest.mark.parametrize("kind", ["purchase", "result", "order"])
    def test_a_field_on_one_side_only_is_refused(self, kind: str, change: str) -> None:
        """A field that one worker's class has and the other's lacks (added on the
        writer's side, or on the reader's: one field short) fails the frame."""
        p = purchase(7)
        read: Callable[[frames.Frame], object]
        if kind == "purchase":
            frame, read = frames.read(frames.purchase_frame(1, p)), frames.purchase_of
        else:
            frame, read = frames.read(frames.result_frame(1, confirmed(p))), frames.result_of
        values = frame[1]
        if kind == "order":
            values = next(v for v in values if isinstance(v, list))
        if change == "added":
            values.append("x")
        else:
            values.pop()
        with pytest.raises(frames.FrameMismatch):
            read(frame)

    @pytest.mark.parametrize("cls", every_error(), ids=lambda cls: cls.__name__)
    def test_every_gateway_error_is_rebuilt_by_its_constructor(
        self, cls: type[GatewayError]
    ) -> None:
        """Each error class comes back of its class with every attribute, and an
        argument its class does not take fails the frame."""
        params = inspect.signature(cls).parameters
        error = cls(**{name: ARGUMENTS[name] for name in params})
        frame = frames.read(frames.error_frame(5, error))
        assert not frames.is_result(frame)
        got = frames.error_of(frame)
        assert type(got) is cls
        assert vars(got) == vars(error)
        assert (str(got), got.body()) == (str(error), error.body())
        frame[2]["coupon"] = "x"
        with pytest.raises(frames.FrameMismatch):
            frames.error_of(frame)
