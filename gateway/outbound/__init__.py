"""The adapters to the shop's own systems: the sinks order events are delivered
to besides the Redis stream, a signed webhook (``webhook.py``) and RabbitMQ
(``amqp.py``). They import the domain and the settings only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from gateway.domain.events import EventSink
from gateway.outbound.amqp import AmqpSink
from gateway.outbound.webhook import OnAnswer, WebhookSink
from gateway.settings import Settings

__all__ = ["AmqpSink", "OnAnswer", "WebhookSink", "open_sinks"]


@asynccontextmanager
async def open_sinks(settings: Settings, on_answer: OnAnswer) -> AsyncIterator[list[EventSink]]:
    """The configured sinks, closed on exit: the webhook when GATEWAY_WEBHOOK_URL
    is set (``on_answer`` gets each POST's answer class), RabbitMQ when
    GATEWAY_EVENTS_AMQP_URL is set; none when neither is.

    The broker is connected to once, here: raises
    :class:`gateway.settings.Misconfigured` when it cannot be used, not final
    when nothing answers yet (``gateway.resources.sinks_when_ready`` waits
    for it as start-up waits for Redis). A broker lost later is reconnected
    to in the background, and the relay retries what it could not deliver.
    """
    async with AsyncExitStack() as stack:
        sinks: list[EventSink] = []
        if settings.webhook_url is not None:
            webhook = WebhookSink(settings, on_answer)
            stack.push_async_callback(webhook.close)
            sinks.append(webhook)
        if settings.events_amqp_url is not None:
            amqp = await AmqpSink.open(settings)
            stack.push_async_callback(amqp.close)
            sinks.append(amqp)
        yield sinks
