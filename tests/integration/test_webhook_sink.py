"""The webhook sink against loopback receivers: what a POST carries, which
answers are deliveries, timeouts, redirects, and POSTs sent side by side."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson

from gateway.outbound.webhook import CONCURRENCY, WebhookSink
from gateway.settings import load
from testkit.order_events import order_events
from testkit.webhook_receivers import Receiver, receiving

SECRET = "webhook-test-secret-0123456789"
# deliver() of a receiver that hangs must end within its timeout; this bounds
# the wait so a sink that hangs with it fails the test instead of holding it.
BOUND_S = 30.0


@asynccontextmanager
async def webhook(
    url: str, answers: Counter[str], timeout_s: float = 5.0
) -> AsyncIterator[WebhookSink]:
    """A sink POSTing to ``url``, counting its answers' classes in ``answers``."""
    settings = load(
        {
            "GATEWAY_WEBHOOK_URL": url,
            "GATEWAY_WEBHOOK_SECRET": SECRET,
            "GATEWAY_WEBHOOK_TIMEOUT_S": str(timeout_s),
        }
    )
    sink = WebhookSink(settings, lambda klass: answers.update([klass]))
    try:
        yield sink
    finally:
        await sink.close()


async def deliver(sink: WebhookSink, count: int) -> list[str | None]:
    """Deliver ``count`` new events of distinct orders; what the sink answered."""
    async with asyncio.timeout(BOUND_S):
        return list(await sink.deliver(order_events(count)))


async def test_a_2xx_is_a_delivery_with_the_event_id_and_a_signature_that_verifies() -> None:
    """Each event is one POST of its JSON, with its id and a signature of
    "<t>.<body>" by the secret; a 2xx counts as delivered."""
    receiver, answers = Receiver(status=200), Counter[str]()
    events = order_events(3)
    async with receiving(receiver) as url, webhook(url, answers) as sink:
        before = int(time.time())
        assert list(await sink.deliver(events)) == [None, None, None]
    assert answers == {"2xx": 3}
    by_id = {r.headers["Flashsale-Event-Id"]: r for r in receiver.received}
    assert set(by_id) == {e.event_id for e in events}
    for event in events:
        got = by_id[event.event_id]
        assert got.path == "/hook" and got.headers["Content-Type"] == "application/json"
        assert orjson.loads(got.body) == event.payload()
        fields = dict(p.split("=", 1) for p in got.headers["Flashsale-Signature"].split(","))
        assert set(fields) == {"t", "v1"} and before <= int(fields["t"]) <= time.time()
        mac = hmac.new(SECRET.encode(), fields["t"].encode() + b"." + got.body, hashlib.sha256)
        assert hmac.compare_digest(fields["v1"], mac.hexdigest())


async def test_a_5xx_and_a_4xx_are_not_deliveries() -> None:
    """An answer outside 2xx leaves the event undelivered, with the status as the reason."""
    for status, klass in ((500, "5xx"), (404, "4xx")):
        answers = Counter[str]()
        async with receiving(Receiver(status=status)) as url, webhook(url, answers) as sink:
            assert await deliver(sink, 2) == [f"answered {status}"] * 2
        assert answers == {klass: 2}


async def test_a_redirect_is_not_followed_nor_a_delivery() -> None:
    """A 302 is not a delivery, and its Location is never POSTed to."""
    receiver, answers = Receiver(status=302), Counter[str]()
    async with receiving(receiver) as url, webhook(url, answers) as sink:
        assert await deliver(sink, 1) == ["answered 302"]
    assert [r.path for r in receiver.received] == ["/hook"]
    assert answers == {"3xx": 1}


async def test_a_receiver_that_hangs_is_a_timeout() -> None:
    """No answer within GATEWAY_WEBHOOK_TIMEOUT_S: not delivered, counted as a timeout."""
    receiver, answers = Receiver(hang=True), Counter[str]()
    async with receiving(receiver) as url, webhook(url, answers, timeout_s=0.3) as sink:
        assert await deliver(sink, 2) == ["no answer within 0.3s"] * 2
    assert answers == {"timeout": 2}


async def test_a_slow_2xx_within_the_timeout_is_a_delivery() -> None:
    """A 2xx that takes a while, but less than the timeout, is delivered."""
    answers = Counter[str]()
    async with (
        receiving(Receiver(status=201, delay_s=0.3)) as url,
        webhook(url, answers, timeout_s=5.0) as sink,
    ):
        assert await deliver(sink, 2) == [None, None]
    assert answers == {"2xx": 2}


async def test_nothing_listening_is_an_error() -> None:
    """A refused connection is not delivered and is counted as an error."""
    answers = Counter[str]()
    async with receiving(Receiver()) as url:
        pass  # the port is closed again
    async with webhook(url, answers) as sink:
        reasons = await deliver(sink, 1)
    assert reasons[0] is not None and "ClientConnectorError" in reasons[0]
    assert answers == {"error": 1}


async def test_posts_go_side_by_side_up_to_the_bound() -> None:
    """Events to a receiver answering in 50 ms are sent concurrently: the
    receiver holds CONCURRENCY of them at once, and never more."""
    receiver, answers = Receiver(delay_s=0.05, gate=CONCURRENCY), Counter[str]()
    async with receiving(receiver) as url, webhook(url, answers) as sink:
        assert await deliver(sink, CONCURRENCY + 36) == [None] * (CONCURRENCY + 36)
    assert receiver.max_in_flight == CONCURRENCY
    assert answers == {"2xx": CONCURRENCY + 36}
