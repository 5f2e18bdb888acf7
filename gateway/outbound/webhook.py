"""The webhook sink: each order event POSTed, signed, to the shop's URL.

A 2xx is a delivery; anything else (a redirect is not followed), a connection
error or a timeout is not, and the relay retries it. The signature lets the
receiver check that the body is ours and fresh (docs/events.md):
``Flashsale-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Callable, Sequence

import aiohttp

from gateway.domain.events import OrderEvent, SinkName
from gateway.settings import Settings

# Called once per POST with its answer's class: "2xx", "3xx", "4xx", "5xx",
# "timeout" or "error" (the metric of webhook answers by class).
OnAnswer = Callable[[str], None]

# POSTs in flight at once, across deliver calls: a receiver that answers in
# 50 ms still takes 1,000 events a second, and a slow one is not flooded with
# connections (each in flight holds one of the pool's).
CONCURRENCY = 64
# Of an answer's body, what is read (and thrown away) so its connection can be
# reused; a longer body closes the connection instead.
ANSWER_READ_BYTES = 64 * 1024

EVENT_ID_HEADER = "Flashsale-Event-Id"
SIGNATURE_HEADER = "Flashsale-Signature"


def signature(secret: str, body: bytes, t: int) -> str:
    """The ``Flashsale-Signature`` value of ``body`` sent at unix second ``t``."""
    mac = hmac.new(secret.encode(), b"%d." % t + body, hashlib.sha256)
    return f"t={t},v1={mac.hexdigest()}"


def answer_class(status: int) -> str:
    """``"2xx"`` ... ``"5xx"`` for an HTTP status (1xx never reaches here)."""
    return f"{min(max(status // 100, 2), 5)}xx"


class WebhookSink:
    """POSTs events to GATEWAY_WEBHOOK_URL on one connection pool."""

    name = SinkName.WEBHOOK
    # POSTs each event's JSON, made from its fields.
    packed = False

    def __init__(self, settings: Settings, on_answer: OnAnswer) -> None:
        if settings.webhook_url is None or settings.webhook_secret is None:
            raise ValueError("a webhook needs GATEWAY_WEBHOOK_URL and GATEWAY_WEBHOOK_SECRET")
        self._url, self._secret = settings.webhook_url, settings.webhook_secret
        self._timeout_s = settings.webhook_timeout_s
        self.max_age_s: float | None = settings.webhook_max_age_s
        self._on_answer = on_answer
        self._slots = asyncio.Semaphore(CONCURRENCY)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CONCURRENCY),
            timeout=aiohttp.ClientTimeout(total=self._timeout_s),
        )

    async def deliver(self, events: Sequence[OrderEvent]) -> Sequence[str | None]:
        """POST each event, up to CONCURRENCY at once; None for each 2xx, else why not."""
        return await asyncio.gather(*(self._post(event) for event in events))

    async def _post(self, event: OrderEvent) -> str | None:
        body = event.body()
        headers = {
            "Content-Type": "application/json",
            EVENT_ID_HEADER: event.event_id,
            SIGNATURE_HEADER: signature(self._secret, body, int(time.time())),
        }
        async with self._slots:
            try:
                async with self._session.post(
                    self._url, data=body, headers=headers, allow_redirects=False
                ) as answer:
                    await _discard(answer.content)
                    status = answer.status
            except TimeoutError:
                self._on_answer("timeout")
                return f"no answer within {self._timeout_s:g}s"
            except aiohttp.ClientError as exc:
                self._on_answer("error")
                return f"{type(exc).__name__}: {exc}"[:200]
        self._on_answer(answer_class(status))
        return None if 200 <= status < 300 else f"answered {status}"

    async def close(self) -> None:
        """Close the connection pool."""
        await self._session.close()


async def _discard(content: aiohttp.StreamReader) -> None:
    """Read and drop up to ANSWER_READ_BYTES of an answer's body."""
    left = ANSWER_READ_BYTES
    while left > 0 and (chunk := await content.read(left)):
        left -= len(chunk)
