"""docs/events.md's declaration of a consumer's queue works on a plain
RabbitMQ, without the management plugin (issue 40.9): run as the page shows
it, against the test broker, it binds a durable queue that then gets the
exchange's events."""

from __future__ import annotations

import asyncio
import re
import sys
import uuid

import aio_pika

from testkit.gateways import REPO
from testkit.polling import wait_for
from testkit.services import AMQP_URL

EVENTS_MD = REPO / "docs" / "events.md"
# The here-document the page runs: python - URL <<'EOF' ... EOF
SNIPPET = re.compile(r"python - (\S+) <<'EOF'\n(.*?)\nEOF\n", re.DOTALL)


async def test_the_documented_declaration_binds_a_queue_on_a_plain_broker() -> None:
    """The page's script, its names made this test's own, declares the queue
    and binds it: an event published to the exchange reaches it."""
    found = SNIPPET.search(EVENTS_MD.read_text())
    assert found is not None, "no declaration script on docs/events.md"
    tag = uuid.uuid4().hex[:12]
    exchange, queue_name = f"flashsale.test.{tag}", f"payments.test.{tag}"
    script = found[2].replace('"flashsale.events"', f'"{exchange}"')
    script = script.replace('"payments"', f'"{queue_name}"')
    assert exchange in script and queue_name in script
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-",
        AMQP_URL,
        stdin=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(script.encode()), timeout=60)
    assert proc.returncode == 0, err.decode()
    async with await aio_pika.connect(AMQP_URL) as connection:
        channel = await connection.channel()
        try:
            target = await channel.get_exchange(exchange)
            await target.publish(aio_pika.Message(b"{}"), routing_key="order.paid")
            queue = await channel.get_queue(queue_name)
            message = await wait_for(
                lambda: queue.get(fail=False, timeout=5), within=10, what="the event in the queue"
            )
            assert message.body == b"{}"
        finally:
            await channel.queue_delete(queue_name)
            await channel.exchange_delete(exchange)
