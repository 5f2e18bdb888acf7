"""A Redis failover loses no event: the stream sink counts a batch delivered only
once a replica holds it (GATEWAY_EVENTS_STREAM_REPLICAS, WAIT).

Replication is asynchronous: a primary acknowledges an XADD before its replica
has it. If the primary then dies and the replica is promoted, the entry is
gone, while the outbox, told it was delivered, has forgotten the event. Here
the replica's link runs through a fault proxy that holds the replication
stream, so that window is as wide as the test needs, not a millisecond; the
promotion is the REPLICAOF NO ONE a Sentinel would send.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from gateway.redis.connections import RedisClient, create_redis
from gateway.redis.event_stream import REPLICA_WAIT_MS, EventStream
from gateway.settings import Settings
from testkit.order_events import order_event
from testkit.polling import wait_for
from testkit.proxy import FaultProxy
from testkit.redis_servers import RedisServer

KEY = "failover:events"
SHORT = f"redis: on 0 of 1 replicas after {REPLICA_WAIT_MS} ms"


async def _event_ids(server: RedisServer) -> list[str]:
    async with server.client() as r:
        entries: list[tuple[str, dict[str, str]]] = await r.xrange(KEY)  # type: ignore[assignment]
    return [fields["event_id"] for _, fields in entries]


Sink = Callable[[RedisServer, int], EventStream]


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    """A factory of stream sinks on a server, waiting for that many replicas."""
    clients: list[RedisClient] = []

    def make(server: RedisServer, replicas: int) -> EventStream:
        clients.append(create_redis(Settings(redis_url=server.url())))
        return EventStream(
            clients[-1], KEY, max_len=0, max_age_s=0.0, webhook_owed=None, replicas=replicas
        )

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
async def pair() -> AsyncIterator[tuple[RedisServer, FaultProxy, RedisServer]]:
    """A primary and its replica, replicating through a proxy."""
    async with (
        RedisServer() as primary,
        FaultProxy(*primary.address, name="replication") as link,
        RedisServer(replicaof=link.address) as replica,
    ):
        await replica.wait_synced()
        yield primary, link, replica


@pytest.mark.chaos
@pytest.mark.timeout(60)
async def test_an_event_only_a_dying_primary_held_is_not_delivered(
    pair: tuple[RedisServer, FaultProxy, RedisServer], sink: Sink
) -> None:
    """With replication held, a batch appended without waiting counts as
    delivered and is lost when the replica is promoted; the waiting sink
    refuses its batch (on 0 of 1 replicas), refuses again on the promoted
    primary while it has no replica, and delivers once the old primary is
    back as its replica: every event it called delivered survives (the
    refused appends stay too, as redeliveries with the same event_id)."""
    primary, link, replica = pair
    waiting, not_waiting = sink(primary, 1), sink(primary, 0)
    first, lost, kept = order_event(1), order_event(2), order_event(3)
    assert await waiting.deliver([first]) == [None]
    assert await _event_ids(replica) == [first.event_id], "delivered: on the replica"

    link.stall()
    assert await not_waiting.deliver([lost]) == [None], "the primary alone said yes"
    assert await waiting.deliver([kept]) == [SHORT]
    await primary.kill()
    link.cut()
    await replica.replicaof(None)
    assert await _event_ids(replica) == [first.event_id], "the promoted replica lost the rest"

    promoted = sink(replica, 1)
    assert await promoted.deliver([kept]) == [SHORT], "alone, a primary cannot keep it safe"
    await primary.restart()
    await primary.replicaof(replica)
    await primary.wait_synced()

    async def delivered() -> bool:
        return await promoted.deliver([kept]) == [None]

    await wait_for(delivered, within=20, what="the batch on the returned replica")
    ids = await _event_ids(replica)
    # Each refused append stayed on the stream: a redelivery, with its event_id.
    assert ids[0] == first.event_id and set(ids[1:]) == {kept.event_id}, ids
    assert await _event_ids(primary) == ids, "the replica holds what was delivered"
