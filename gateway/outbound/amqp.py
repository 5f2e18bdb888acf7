"""The RabbitMQ sink: each order event published to a durable topic exchange.

Routing key the event's type, persistent, ``message_id`` the event id, and
publisher confirms: an event is delivered once the broker confirmed it, and a
nack, a timeout or a connection lost before the confirm is not a delivery (the
relay publishes it again, under the same ``message_id``). The connection is
aio-pika's robust one: after the broker comes back it reconnects and declares
the exchange again by itself; what failed meanwhile the relay retries.

Published without ``mandatory``: an event the broker confirmed is delivered
even when no queue is bound to its routing key, and the broker drops it. A
topic exchange's subscribers choose the types they bind; a type nobody binds
must not hold the outbox back forever (docs/events.md says to bind a durable
queue before events flow).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Sequence
from urllib.parse import urlsplit

import aio_pika
import orjson
from aio_pika.abc import AbstractExchange, AbstractRobustConnection
from aio_pika.exceptions import (
    CONNECTION_EXCEPTIONS,
    AMQPConnectionError,
    AMQPError,
    DeliveryError,
    IncompatibleProtocolError,
    ProbableAuthenticationError,
)

from gateway.domain.events import OrderEvent, SinkName
from gateway.settings import Misconfigured, Settings

# Longest wait for a publish's confirm: a broker under a memory or disk alarm
# blocks publishers, and the relay would rather retry than wait on it.
CONFIRM_TIMEOUT_S = 10.0
# Longest a connection attempt takes, at start-up and on each reconnection.
CONNECT_TIMEOUT_S = 5.0
# Pause between reconnection attempts once the broker went away (aio-pika's
# default is 5 s): events wait for it in the outbox meanwhile.
RECONNECT_INTERVAL_S = 1.0
# Publishes awaiting their confirm at once: they share one channel, so this
# bounds the unconfirmed messages the broker holds for us.
CONCURRENCY = 256
DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671}
SETTING = "events_amqp_url"


class AmqpSink:
    """Publishes events to GATEWAY_EVENTS_AMQP_EXCHANGE with publisher confirms."""

    name = SinkName.AMQP
    # The broker is ours to wait for: an event is never dead-lettered for it.
    max_age_s: float | None = None
    # Publishes each event's JSON, made from its fields.
    packed = False

    def __init__(self, connection: AbstractRobustConnection, exchange: AbstractExchange) -> None:
        self._connection, self._exchange = connection, exchange
        self._slots = asyncio.Semaphore(CONCURRENCY)

    @classmethod
    async def open(cls, settings: Settings) -> AmqpSink:
        """Connect and declare the exchange, once.

        Raises :class:`Misconfigured` naming GATEWAY_EVENTS_AMQP_URL: not
        final when nothing answers (a broker still starting), final when the
        broker refuses us or is not one.
        """
        url = settings.events_amqp_url
        if url is None:
            raise ValueError("AmqpSink needs GATEWAY_EVENTS_AMQP_URL")
        try:
            connection = await aio_pika.connect_robust(
                url, timeout=CONNECT_TIMEOUT_S, reconnect_interval=RECONNECT_INTERVAL_S
            )
        except CONNECTION_EXCEPTIONS as exc:
            raise _diagnosis(url, exc) from exc
        try:
            channel = await connection.channel(publisher_confirms=True)
            exchange = await channel.declare_exchange(
                settings.events_amqp_exchange, aio_pika.ExchangeType.TOPIC, durable=True
            )
        except BaseException as exc:
            await connection.close()
            if isinstance(exc, CONNECTION_EXCEPTIONS):
                raise _diagnosis(url, exc) from exc
            raise
        return cls(connection, exchange)

    async def deliver(self, events: Sequence[OrderEvent]) -> Sequence[str | None]:
        """Publish each event, confirms awaited together; None for each confirmed."""
        return await asyncio.gather(*(self._publish(event) for event in events))

    async def _publish(self, event: OrderEvent) -> str | None:
        payload = event.payload()
        # The routing key and the message's type: the event's type as sent, even
        # one a newer release writes that this one has no member for.
        kind = str(payload["type"])
        message = aio_pika.Message(
            orjson.dumps(payload),
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=event.event_id,
            type=kind,
        )
        async with self._slots:
            try:
                await self._exchange.publish(
                    message, kind, mandatory=False, timeout=CONFIRM_TIMEOUT_S
                )
            except TimeoutError:  # an OSError too: before the others
                return f"no confirm within {CONFIRM_TIMEOUT_S:g}s"
            except DeliveryError:
                return "nacked by the broker"
            except CONNECTION_EXCEPTIONS as exc:
                return f"{type(exc).__name__}: {exc}"[:200]
        return None

    async def close(self) -> None:
        """Close the connection (and stop its reconnecting)."""
        await self._connection.close()


def _diagnosis(url: str, exc: BaseException) -> Misconfigured:
    """What a failed connection or declaration found, as the one line: not
    final when it may be a broker still starting (docs/settings.md)."""
    parts = urlsplit(url)
    where = f"{parts.hostname}:{parts.port or DEFAULT_PORTS.get(parts.scheme, 5672)}"
    # aiormq raises a socket's error again as its own, the original as the cause.
    if isinstance(exc, AMQPConnectionError) and isinstance(exc.__cause__, OSError):
        exc = exc.__cause__
    words = " ".join(str(exc).split())[:200] or type(exc).__name__
    if isinstance(exc, ProbableAuthenticationError):
        return Misconfigured(SETTING, url, f"the broker refused the login ({words})")
    if isinstance(exc, ssl.SSLError):
        return Misconfigured(SETTING, url, f"TLS failed at {where} ({words})")
    if isinstance(exc, socket.gaierror):
        found = f"host {parts.hostname} not found ({exc.strerror})"
        return Misconfigured(SETTING, url, found, final=False)
    if isinstance(exc, TimeoutError):
        found = f"no AMQP answer within {CONNECT_TIMEOUT_S:g}s at {where}"
        return Misconfigured(SETTING, url, found, final=False)
    if not isinstance(exc, AMQPError):  # refused, unreachable, reset
        return Misconfigured(SETTING, url, f"nothing answers at {where}", final=False)
    if isinstance(exc, AMQPConnectionError | IncompatibleProtocolError):
        return Misconfigured(SETTING, url, f"not AMQP ({where}: {words})")
    return Misconfigured(SETTING, url, f"the broker refused ({words})")
