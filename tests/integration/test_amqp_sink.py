"""The RabbitMQ sink against the shared broker (127.0.0.1:5672, guest), each
test on an exchange of its own: what a message carries, confirms, and
``open_sinks`` with what it is configured with."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import aio_pika
import orjson
import pytest
from aio_pika.abc import AbstractChannel, AbstractQueue
from pamqp.common import FieldTable
from structlog.testing import capture_logs

from gateway.outbound import AmqpSink, WebhookSink, open_sinks
from gateway.resources import sinks_when_ready
from gateway.settings import Misconfigured, Settings, load
from testkit.order_events import order_events
from testkit.polling import wait_for
from testkit.ports import free_port
from testkit.services import AMQP_URL


def amqp_settings(exchange: str, url: str = AMQP_URL, **more: str) -> Settings:
    """Settings publishing to ``exchange`` at ``url``, and ``more``."""
    return load({"GATEWAY_EVENTS_AMQP_URL": url, "GATEWAY_EVENTS_AMQP_EXCHANGE": exchange, **more})


@pytest.fixture
async def channel() -> AsyncIterator[AbstractChannel]:
    """A consumer's channel on the shared broker."""
    connection = await aio_pika.connect(AMQP_URL)
    async with connection:
        yield await connection.channel()


@pytest.fixture
async def exchange(channel: AbstractChannel) -> AsyncIterator[str]:
    """This test's exchange name, deleted at its end."""
    name = f"flashsale.test.{uuid.uuid4().hex[:12]}"
    yield name
    await channel.exchange_delete(name)


async def bound_queue(
    channel: AbstractChannel, exchange: str, arguments: FieldTable | None = None
) -> AbstractQueue:
    """A queue of the consumer's, bound to every event of ``exchange``."""
    await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
    queue = await channel.declare_queue(exclusive=True, arguments=arguments)
    await queue.bind(exchange, routing_key="order.#")
    return queue


async def drain(queue: AbstractQueue, count: int) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """The first ``count`` messages of ``queue``, waited for."""
    got: list[aio_pika.abc.AbstractIncomingMessage] = []

    async def more() -> bool:
        message = await queue.get(fail=False, no_ack=True)
        if message is not None:
            got.append(message)
        return len(got) >= count

    await wait_for(more, within=10, what=f"{count} messages", interval=0.01)
    return got


async def test_events_arrive_persistent_routed_by_type_with_their_id(
    channel: AbstractChannel, exchange: str
) -> None:
    """Each confirmed event is a persistent JSON message on the topic exchange,
    routing key its type, message_id its event id, body its JSON."""
    queue = await bound_queue(channel, exchange)
    events = order_events(5)
    sink = await AmqpSink.open(amqp_settings(exchange))
    try:
        assert list(await sink.deliver(events)) == [None] * 5
    finally:
        await sink.close()
    by_id = {m.message_id: m for m in await drain(queue, 5)}
    assert set(by_id) == {e.event_id for e in events}
    for event in events:
        message = by_id[event.event_id]
        assert message.routing_key == event.type and message.type == event.type
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert message.content_type == "application/json"
        assert orjson.loads(message.body) == event.payload()


async def test_a_nack_is_not_a_delivery(channel: AbstractChannel, exchange: str) -> None:
    """A queue that rejects what it has no room for makes the broker nack: the
    confirm is honoured, and the nacked events are not delivered."""
    await bound_queue(channel, exchange, {"x-max-length": 2, "x-overflow": "reject-publish"})
    sink = await AmqpSink.open(amqp_settings(exchange))
    try:
        first = await sink.deliver(order_events(2))
        then = await sink.deliver(order_events(2, first=3))
    finally:
        await sink.close()
    assert list(first) == [None, None]
    assert list(then) == ["nacked by the broker"] * 2


async def test_an_event_no_queue_takes_is_delivered(exchange: str) -> None:
    """Published without mandatory: with nothing bound, the broker confirms and
    drops it, and it counts as delivered (docs/events.md says to bind first)."""
    sink = await AmqpSink.open(amqp_settings(exchange))
    try:
        assert list(await sink.deliver(order_events(1))) == [None]
    finally:
        await sink.close()


async def test_open_sinks_opens_what_is_configured(exchange: str) -> None:
    """None configured: no sink. A webhook URL and an AMQP URL: both, webhook
    first, each with its max age; closed on exit."""
    async with open_sinks(load({}), lambda _: None) as none:
        assert none == []
    both = amqp_settings(
        exchange,
        GATEWAY_WEBHOOK_URL="http://127.0.0.1:9/hook",
        GATEWAY_WEBHOOK_SECRET="0123456789abcdef",
        GATEWAY_WEBHOOK_MAX_AGE_S="60",
    )
    async with open_sinks(both, lambda _: None) as sinks:
        webhook, amqp = sinks
        assert isinstance(webhook, WebhookSink) and isinstance(amqp, AmqpSink)
        assert (webhook.name, amqp.name) == ("webhook", "amqp")
        assert (webhook.max_age_s, amqp.max_age_s) == (60.0, None)


@pytest.mark.parametrize(
    ("url", "found", "final"),
    [
        ("amqp://guest:wrong@127.0.0.1:5672/", "the broker refused the login", True),
        ("amqp://guest:guest@127.0.0.1:5672/no-such-vhost", "the broker refused", True),
        ("amqp://guest:guest@127.0.0.1:5432/", "not AMQP", True),
        ("amqps://guest:guest@127.0.0.1:5672/", "TLS failed at 127.0.0.1:5672", True),
        ("amqp://guest:guest@127.0.0.1:{port}/", "nothing answers at 127.0.0.1:{port}", False),
        ("amqp://guest:guest@no-such-host.invalid/", "host no-such-host.invalid not found", False),
    ],
)
async def test_a_broker_it_cannot_use_is_misconfigured(
    exchange: str, url: str, found: str, final: bool
) -> None:
    """What cannot be used at start is one line naming GATEWAY_EVENTS_AMQP_URL
    (password masked) and what is there; only what may be a broker still
    starting is not final."""
    port = free_port()
    with pytest.raises(Misconfigured) as info:
        async with open_sinks(amqp_settings(exchange, url.format(port=port)), lambda _: None):
            pass
    scheme = url.partition(":")[0]
    assert str(info.value).startswith(f"GATEWAY_EVENTS_AMQP_URL={scheme}://guest:***@")
    assert found.format(port=port) in info.value.found and info.value.final is final
    assert "\n" not in str(info.value)


async def test_an_exchange_of_another_kind_is_misconfigured(channel: AbstractChannel) -> None:
    """An exchange of that name that is not a topic one is refused at once."""
    name = f"flashsale.test.direct.{uuid.uuid4().hex[:8]}"
    await channel.declare_exchange(name, aio_pika.ExchangeType.DIRECT)
    try:
        with pytest.raises(Misconfigured, match="PRECONDITION_FAILED") as info:
            await AmqpSink.open(amqp_settings(name))
        assert info.value.final
    finally:
        await channel.exchange_delete(name)


async def test_start_up_waits_for_a_broker_then_names_it(exchange: str) -> None:
    """Nothing answering: start-up tries again for GATEWAY_STARTUP_WAIT_S, each
    wait logged with the setting, then raises the not-final Misconfigured; a
    final one is raised at once; a broker that answers is used."""
    url = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    waiting = amqp_settings(exchange, url, GATEWAY_STARTUP_WAIT_S="0.5")
    with capture_logs() as logs, pytest.raises(Misconfigured, match="nothing answers"):
        async with sinks_when_ready(waiting, lambda _: None):
            pass
    waits = [e for e in logs if e["event"] == "waiting_for_dependency"]
    assert waits and {e["setting"] for e in waits} == {"GATEWAY_EVENTS_AMQP_URL"}
    refused = amqp_settings(exchange, "amqp://guest:x@127.0.0.1:5672/")
    with capture_logs() as logs, pytest.raises(Misconfigured, match="refused the login"):
        async with sinks_when_ready(refused, lambda _: None):
            pass
    assert not [e for e in logs if e["event"] == "waiting_for_dependency"]
    async with sinks_when_ready(amqp_settings(exchange), lambda _: None) as sinks:
        assert [s.name for s in sinks] == ["amqp"]
