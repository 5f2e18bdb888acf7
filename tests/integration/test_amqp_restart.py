"""RabbitMQ stopped, or killed, and started again while events stream to it:
none is lost, and every confirm the sink reported stands (a private broker,
never the shared one)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import aio_pika
import pytest

from gateway.domain.events import OrderEvent
from gateway.outbound import AmqpSink
from gateway.settings import load
from testkit.order_events import order_events
from testkit.polling import wait_for
from testkit.rabbitmq_servers import RabbitServer

ROUND = 20
# Between two rounds, as the relay's polling and backoff would pause.
ROUND_PAUSE_S = 0.02


class Relay:
    """The relay's part, reduced: each round delivers what is undelivered and
    ROUND new events, until told it has enough, then until all are delivered."""

    def __init__(self, sink: AmqpSink) -> None:
        self.sink = sink
        self.made: list[OrderEvent] = []
        self.undelivered: list[OrderEvent] = []
        self.confirmed: set[str] = set()
        self.failed_rounds = 0
        self.enough = False

    async def run(self) -> None:
        while not self.enough or self.undelivered:
            fresh = [] if self.enough else order_events(ROUND, first=len(self.made) + 1)
            self.made += fresh
            batch, self.undelivered = self.undelivered + fresh, []
            for event, reason in zip(batch, await self.sink.deliver(batch), strict=True):
                if reason is None:
                    self.confirmed.add(event.event_id)
                else:
                    self.undelivered.append(event)
            self.failed_rounds += bool(self.undelivered)
            await asyncio.sleep(ROUND_PAUSE_S)


async def queued_ids(url: str, queue_name: str, expected: int) -> Counter[str]:
    """The message ids in the durable queue, read until ``expected`` arrived."""
    seen = Counter[str]()
    connection = await aio_pika.connect(url)
    async with connection:
        queue = await (await connection.channel()).declare_queue(queue_name, durable=True)

        async def more() -> bool:
            while (message := await queue.get(fail=False, no_ack=True)) is not None:
                seen[message.message_id or ""] += 1
            return sum(seen.values()) >= expected

        await wait_for(more, within=30, what=f"{expected} messages in {queue_name}")
    return seen


async def outage(server: RabbitServer, fault: str, relay: Relay) -> int:
    """Stop the broker (``stop_app``: it closes every connection) or SIGKILL it
    (``kill``: a crash), wait for deliveries to fail, start it again; how many
    events had been made when it went down."""
    if fault == "kill":
        await server.kill()
    else:
        await server.stop_app()
    down = len(relay.made)
    await wait_for(lambda: relay.failed_rounds >= 3, within=30, what="rounds failing")
    if fault == "kill":
        await server.start()
    else:
        await server.start_app()
    return down


@pytest.mark.parametrize("fault", ["stop_app", "kill"])
async def test_a_broker_restarted_mid_stream_loses_no_event(
    rabbit_server: RabbitServer, fault: str
) -> None:
    """Events stream while the broker goes away and comes back: those sent while
    it is down are not delivered, the connection comes back by itself, and at
    the end every event is in the durable queue, each confirmed one too; a
    repeat carries the same message_id."""
    exchange, queue_name = f"flashsale.restart.{uuid.uuid4().hex[:8]}", f"restart-{fault}"
    setup = await aio_pika.connect(rabbit_server.url)
    async with setup:
        channel = await setup.channel()
        await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(queue_name, durable=True)
        for routing_key in ("order.#", "payment.#"):
            await queue.bind(exchange, routing_key=routing_key)
    settings = load(
        {"GATEWAY_EVENTS_AMQP_URL": rabbit_server.url, "GATEWAY_EVENTS_AMQP_EXCHANGE": exchange}
    )
    sink = await AmqpSink.open(settings)
    relay = Relay(sink)
    try:
        streaming = asyncio.create_task(relay.run())
        await wait_for(lambda: len(relay.confirmed) >= 100, within=30, what="100 confirmed")
        down = await outage(rabbit_server, fault, relay)
        up = len(relay.confirmed)
        await wait_for(lambda: len(relay.confirmed) >= up + 100, within=30, what="back")
        relay.enough = True
        async with asyncio.timeout(60):
            await streaming
    finally:
        await sink.close()
    assert len(relay.made) > down, "events were made while the broker was down"
    ids = {e.event_id for e in relay.made}
    assert relay.confirmed == ids
    seen = await queued_ids(rabbit_server.url, queue_name, len(ids))
    assert set(seen) == ids
