"""A sale with a payment window, driven from outside (``loadtests.bench_lifecycle``).

New buyers keep buying one unit each until every unit is paid. Each 201 gets a
fate by its place in the order of 201s, so the shares are exact: three in ten
never pay (the order expires at its ``pay_by``), one in ten cancels, the rest
pay; resold units meet the same fates, so the sale ends in waves, each a
window after the last. Payers and cancellers act within the first half of the
window, so none races its deadline on a loaded machine.

The outside view of a return (an expired order's ``pay_by``, or a cancel's
200): units are interchangeable, so the k-th return is matched with the k-th
resale (the 201 number units + k). Two measures follow, neither counting the
time buyers take to work through a backlog of returned units:

- a return into a sold-out sale (every unit returned before it already sold
  again): the time until its unit is sold again;
- a sold-out answer to a request sent while a returned unit was not yet sold
  again: how long before the request that unit had come back (a buyer told
  "sold out" that long after a deadline).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp

EXPIRE, CANCEL, PAY = "expire", "cancel", "pay"
SOLD_OUT = "sold_out"
# A fate per place in the order of 201s, out of ten: 30 % never pay, 10 % cancel.
FATES = (EXPIRE, EXPIRE, EXPIRE, CANCEL, PAY, PAY, PAY, PAY, PAY, PAY)
# A purchase answered 503 (the gateway busy) is sent again, with its request id.
RESENDS = 20
RESEND_PAUSE_S = 0.02


@dataclass(frozen=True, slots=True)
class SalePlan:
    """What to sell and how hard: ``units`` of ``sku`` with ``window_s`` to pay;
    ``buyers`` buy at once, each waiting ``poll_s`` (or the Retry-After, if
    shorter) after a sold-out answer; the sale gives up after ``timeout_s`` or
    ``max_purchases`` purchases."""

    url: str
    sku: str
    units: int
    window_s: int
    payment_token: str
    run_id: str
    buyers: int = 32
    poll_s: float = 0.05
    timeout_s: float = 300.0
    max_purchases: int = 0


@dataclass
class SaleLog:
    """What the buyers saw: wall-clock instants (``time.time()``, PostgreSQL's
    clock on this machine being the same) of every 201, of every return, and
    the answers by kind."""

    sold: list[float] = field(default_factory=list)
    # (instant, fate): an expiry at its pay_by, a cancel at its 200.
    returns: list[tuple[float, str]] = field(default_factory=list)
    # When each request answered sold out was sent.
    sold_out: list[float] = field(default_factory=list)
    paid: int = 0
    late_payments: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    started: float = 0.0
    ended: float = 0.0
    finished: bool = False

    def resold_into_sold_out(self, units: int) -> list[tuple[float, str]]:
        """(seconds from a return to its unit sold again, fate) of each return made
        when every unit returned before it was already sold again."""
        sold, returns = sorted(self.sold), sorted(self.returns)
        return [
            (sold[units + k] - back, fate)
            for k, (back, fate) in enumerate(returns)
            if units + k < len(sold) and sold[units + k - 1] <= back
        ]

    def told_sold_out_after_return(self, units: int) -> list[float]:
        """For each sold-out answer to a request sent while a returned unit was not
        yet sold again: seconds since the oldest such unit came back."""
        sold, backs = sorted(self.sold), sorted(back for back, _ in self.returns)
        ages = []
        for sent in self.sold_out:
            resold = bisect.bisect_right(sold, sent) - units
            if 0 <= resold < len(backs) and backs[resold] <= sent:
                ages.append(sent - backs[resold])
        return ages


class Sale:
    """Runs one :class:`SalePlan` and keeps its :class:`SaleLog`."""

    def __init__(self, plan: SalePlan, seed: int = 31) -> None:
        self.plan = plan
        self.log = SaleLog()
        self._rng = random.Random(seed)
        self._numbers = itertools.count()
        self._done = asyncio.Event()
        self._followups: set[asyncio.Task[None]] = set()
        self._limit = plan.max_purchases or 20 * plan.units

    async def run(self) -> SaleLog:
        """Sell until every unit is paid, or the plan's bounds; returns the log."""
        plan = self.plan
        connector = aiohttp.TCPConnector(limit=plan.buyers + 256)
        timeout = aiohttp.ClientTimeout(total=30)
        self.log.started = time.time()
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            buyers = [asyncio.create_task(self._buyer(session)) for _ in range(plan.buyers)]
            try:
                async with asyncio.timeout(plan.timeout_s):
                    await self._done.wait()
            except TimeoutError:
                pass
            self._done.set()
            await asyncio.gather(*buyers)
            if self._followups:
                await asyncio.wait(self._followups, timeout=plan.window_s + 30)
        self.log.ended = time.time()
        return self.log

    async def _buyer(self, session: aiohttp.ClientSession) -> None:
        plan = self.plan
        while not self._done.is_set():
            n = next(self._numbers)
            if n >= self._limit:
                self._done.set()
                return
            sent = time.time()
            status, body, retry_after = await self._purchase(session, n)
            reason = body.get("error") or body.get("status", "")
            self.log.answers[f"purchase {status} {reason}"] += 1
            if status == 201:
                self._sold(session, body)
            elif status == 409 and SOLD_OUT in (body.get("status"), body.get("error")):
                self.log.sold_out.append(sent)
                await asyncio.sleep(min(plan.poll_s, retry_after or plan.poll_s))
            else:
                await asyncio.sleep(plan.poll_s)

    async def _purchase(
        self, session: aiohttp.ClientSession, n: int
    ) -> tuple[int, dict[str, Any], float | None]:
        plan = self.plan
        body = {
            "sku": plan.sku,
            "user_id": f"{plan.run_id}-b{n}",
            "request_id": f"{plan.run_id}-{n}",
        }
        for _ in range(RESENDS):
            async with session.post(f"{plan.url}/v1/purchase", json=body) as response:
                answer = await response.json(content_type=None)
                if response.status != 503:
                    raw = response.headers.get("Retry-After")
                    return response.status, answer, float(raw) if raw else None
            await asyncio.sleep(RESEND_PAUSE_S)
        return 503, answer, None

    def _sold(self, session: aiohttp.ClientSession, order: dict[str, Any]) -> None:
        self.log.sold.append(time.time())
        fate = FATES[(len(self.log.sold) - 1) % len(FATES)]
        pay_by = datetime.fromisoformat(order["pay_by"]).timestamp()
        if fate == EXPIRE:
            self.log.returns.append((pay_by, EXPIRE))
            return
        delay = self._rng.uniform(0, self.plan.window_s / 2)
        task = asyncio.create_task(self._settle(session, order["request_id"], fate, pay_by, delay))
        self._followups.add(task)
        task.add_done_callback(self._followups.discard)

    async def _settle(
        self,
        session: aiohttp.ClientSession,
        request_id: str,
        fate: str,
        pay_by: float,
        delay: float,
    ) -> None:
        await asyncio.sleep(delay)
        plan = self.plan
        url = f"{plan.url}/v1/orders/{request_id}/{fate}"
        body = {"payment_id": f"pay-{request_id}"} if fate == PAY else {}
        headers = {"Authorization": f"Bearer {plan.payment_token}"}
        for _ in range(RESENDS):
            async with session.post(url, json=body, headers=headers) as response:
                answer = await response.json(content_type=None)
                status = response.status
            if status != 503:
                break
            await asyncio.sleep(RESEND_PAUSE_S)
        self.log.answers[f"{fate} {status} {answer.get('error', '')}".strip()] += 1
        if status == 200 and fate == CANCEL:
            self.log.returns.append((time.time(), CANCEL))
        elif status == 200:
            self.log.paid += 1
            if self.log.paid >= plan.units:
                self.log.finished = True
                self._done.set()
        elif fate == PAY and answer.get("error") == "order_expired":
            # Lost to its deadline: the unit came back at pay_by, as a never-payer's.
            self.log.late_payments += 1
            self.log.returns.append((pay_by, EXPIRE))
