"""A load driver whose clients behave like real buyers on a flaky service.

Each client buys once with a request id of its own, which it keeps across
every retry: it retries on 503, on ``409 in_progress`` and on transport errors
(refused, reset, timed out), honouring Retry-After but never sleeping more
than ``retry_cap_s`` (with jitter, so retries do not march in step), and moves
to the next gateway instance when one fails at the transport level. It stops
at the first final answer (201, ``409 sold_out``/``duplicate``, any other
status) or when its budget (attempts and seconds) runs out, and then counts as
``unresolved``. Every attempt is recorded with the instance that answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

CONFIRMED, SOLD_OUT, DUPLICATE, UNRESOLVED = "confirmed", "sold_out", "duplicate", "unresolved"
# Transport failures a real client meets when an instance dies, hangs or drops it.
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


@dataclass(frozen=True)
class ClientPolicy:
    """How hard a client tries before giving up."""

    max_attempts: int = 60
    budget_s: float = 30.0
    attempt_timeout_s: float = 3.0
    retry_cap_s: float = 0.2
    reconnect_pause_s: float = 0.05


@dataclass
class Attempt:
    """One HTTP request of a client and what came back."""

    instance: int
    started_s: float
    elapsed_s: float
    # Wall clock (time.time()) at the start, to line attempts up with log timestamps.
    started_at: float = 0.0
    status: int | None = None
    body: Any = None
    error: str | None = None
    retry_after: str | None = None


@dataclass
class ClientRecord:
    """One client's request id, every attempt, and its final outcome."""

    user_id: str
    request_id: str
    qty: int
    attempts: list[Attempt] = field(default_factory=list)
    outcome: str = UNRESOLVED
    status: int | None = None
    body: Any = None
    instance: int | None = None
    order_id: str | None = None

    @property
    def final(self) -> bool:
        """Whether the client got a final answer (anything but ``unresolved``)."""
        return self.outcome != UNRESOLVED

    def last(self) -> str:
        """The last thing the client saw, for messages about unresolved clients."""
        if not self.attempts:
            return "no attempt"
        a = self.attempts[-1]
        return f"{a.error}" if a.error else f"{a.status} {a.body}"


@dataclass
class DriverSummary:
    """Every client's record, with counts by outcome."""

    sku: str
    records: list[ClientRecord]
    duration_s: float

    @property
    def counts(self) -> Counter[str]:
        """Clients by final outcome (confirmed, sold_out, duplicate, http_NNN, unresolved)."""
        return Counter(r.outcome for r in self.records)

    @property
    def requests(self) -> int:
        """HTTP attempts of all clients."""
        return sum(len(r.attempts) for r in self.records)

    @property
    def confirmed(self) -> dict[str, str | None]:
        """order_id of every 201 the clients saw, by request id."""
        return {r.request_id: r.order_id for r in self.records if r.outcome == CONFIRMED}

    @property
    def unresolved(self) -> list[ClientRecord]:
        """Clients that ran out of budget without a final answer."""
        return [r for r in self.records if not r.final]

    def answers_by_instance(self) -> Counter[int]:
        """Final answers by the instance that gave them."""
        return Counter(r.instance for r in self.records if r.instance is not None)

    def attempts_by(self) -> Counter[str]:
        """Every attempt's result: status code or error class name."""
        return Counter(a.error or str(a.status) for r in self.records for a in r.attempts)

    def counts_text(self) -> str:
        """``confirmed=20 sold_out=40`` (outcomes sorted by name)."""
        return " ".join(f"{k}={v}" for k, v in sorted(self.counts.items())) or "none"


@dataclass
class _Step:
    """What a client does after an attempt."""

    final: bool
    pause_s: float = 0.0
    switch: bool = False


def _retry_after(value: str | None) -> float:
    try:
        return max(float(value), 0.0) if value else 1.0
    except ValueError:
        return 1.0


class LoadDriver:
    """``users`` clients buying ``qty`` of ``sku`` from the gateways at ``urls``."""

    def __init__(
        self,
        urls: Sequence[str],
        sku: str,
        *,
        users: int | Sequence[str],
        qty: int = 1,
        policy: ClientPolicy | None = None,
        run_id: str | None = None,
        start_spread_s: float = 0.0,
        seed: int | None = None,
        hurry: asyncio.Event | None = None,
    ) -> None:
        if not urls:
            raise ValueError("no gateway urls")
        self.urls = list(urls)
        self.sku = sku
        self.user_ids = [f"user-{i}" for i in range(users)] if isinstance(users, int) else users
        self.qty = qty
        self.policy = policy or ClientPolicy()
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.start_spread_s = start_spread_s
        # Once set, a client still waiting out its start in the spread starts at once.
        self.hurry = hurry
        self._random = random.Random(seed)
        self._t0 = 0.0

    def request_id(self, user_id: str) -> str:
        """The stable request id of ``user_id`` in this run."""
        return f"{self.run_id}-{user_id}"

    async def run(self) -> DriverSummary:
        """Run every client to its end; the summary of all of them."""
        self._t0 = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=self.policy.attempt_timeout_s)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
            records = await asyncio.gather(
                *(self._client(http, i, user) for i, user in enumerate(self.user_ids))
            )
        return DriverSummary(self.sku, list(records), time.monotonic() - self._t0)

    async def _client(self, http: aiohttp.ClientSession, index: int, user: str) -> ClientRecord:
        record = ClientRecord(user, self.request_id(user), self.qty)
        body = {"sku": self.sku, "user_id": user, "qty": self.qty, "request_id": record.request_id}
        if self.start_spread_s:
            await self._arrive(self._random.uniform(0, self.start_spread_s))
        deadline = time.monotonic() + self.policy.budget_s
        instance = index % len(self.urls)
        for _ in range(self.policy.max_attempts):
            attempt = await self._attempt(http, instance, body)
            record.attempts.append(attempt)
            step = self._judge(attempt)
            if step.final:
                self._finish(record, attempt)
                break
            if time.monotonic() + step.pause_s >= deadline:
                break
            if step.switch:
                instance = (instance + 1) % len(self.urls)
            await asyncio.sleep(step.pause_s)
        return record

    async def _arrive(self, delay_s: float) -> None:
        """Wait ``delay_s``, or until :attr:`hurry` is set, whichever comes first."""
        if self.hurry is None:
            await asyncio.sleep(delay_s)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.hurry.wait(), delay_s)

    async def _attempt(
        self, http: aiohttp.ClientSession, instance: int, body: dict[str, Any]
    ) -> Attempt:
        started = time.monotonic()
        attempt = Attempt(instance, started - self._t0, 0.0, started_at=time.time())
        try:
            async with http.post(f"{self.urls[instance]}/v1/purchase", json=body) as response:
                attempt.status = response.status
                attempt.retry_after = response.headers.get("Retry-After")
                text = await response.text()
            try:
                attempt.body = json.loads(text)
            except ValueError:
                attempt.body = text  # not JSON: kept as text, judged by status alone
        except TRANSPORT_ERRORS as exc:
            attempt.error = type(exc).__name__
        attempt.elapsed_s = time.monotonic() - started
        return attempt

    def _judge(self, attempt: Attempt) -> _Step:
        if attempt.error is not None:
            # Refused, reset or silent: try the next instance after a short pause.
            pause = self.policy.reconnect_pause_s * self._random.uniform(0.5, 1.5)
            return _Step(final=False, pause_s=pause, switch=True)
        status = attempt.status
        body_status = attempt.body.get("status") if isinstance(attempt.body, dict) else None
        if status == 503 or (status == 409 and body_status == "in_progress"):
            capped = min(_retry_after(attempt.retry_after), self.policy.retry_cap_s)
            return _Step(final=False, pause_s=capped * self._random.uniform(0.5, 1.0))
        return _Step(final=True)

    @staticmethod
    def _finish(record: ClientRecord, attempt: Attempt) -> None:
        record.status = attempt.status
        record.body = attempt.body
        record.instance = attempt.instance
        body = attempt.body if isinstance(attempt.body, dict) else {}
        if attempt.status == 201:
            record.outcome = CONFIRMED
            record.order_id = body.get("order_id")
        elif attempt.status == 409 and body.get("status") in (SOLD_OUT, DUPLICATE):
            record.outcome = str(body["status"])
        else:
            record.outcome = f"http_{attempt.status}"


async def run_sale(
    urls: Sequence[str], sku: str, users: int | Sequence[str], **options: Any
) -> DriverSummary:
    """Shorthand: ``LoadDriver(urls, sku, users=users, **options).run()``."""
    return await LoadDriver(urls, sku, users=users, **options).run()
