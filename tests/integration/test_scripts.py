"""``evalsha_many``: several EVALSHAs in one round trip on a pooled connection;
and ``ScriptCoalescer``, which sends one call per group and loop turn.

The calls skip redis-py's command layer (hiredis packs them), so these tests
check on a real Redis what that layer would otherwise guarantee: each call gets
its own reply or error, an error leaves the connection in step for the next
caller, and a connection killed under the client is reconnected and the calls
sent again.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, NoScriptError, ResponseError

from gateway.redis.scripts import Script, ScriptCoalescer, commands_many, evalsha_many
from testkit.services import REDIS_URL

ECHO = "return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1}"
FAILS = "return redis.error_reply('planted failure')"


def sha(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()


def named_client(name: str, retries: int = 0) -> Redis:
    """A client of its own, named, with a pool of one connection (every call
    reuses the connection the one before it left behind), and ``retries`` on a
    lost connection (none, as the gateway's client)."""
    return Redis.from_url(
        REDIS_URL,
        decode_responses=True,
        client_name=name,
        max_connections=1,
        retry=Retry(NoBackoff(), retries),
    )


@pytest.fixture
async def client() -> AsyncIterator[Redis]:
    redis = named_client(f"test-scripts-{uuid.uuid4().hex[:8]}")
    for source in (ECHO, FAILS):
        await redis.script_load(source)
    yield redis
    await redis.aclose()


async def test_each_call_gets_its_own_reply_and_the_connection_stays_in_step(
    client: Redis, key_prefix: str
) -> None:
    """A reply, an unknown script and a script's error in one write: each comes
    back in its place, and the next round trip reads its own replies, not
    leftovers of the last."""
    key = f"{key_prefix}:{{s}}:k"
    missing = sha(f"return '{uuid.uuid4().hex}'")
    replies = await evalsha_many(
        client,
        [(sha(ECHO), [key], ["a", 1]), (missing, [key], []), (sha(FAILS), [key], [])],
    )
    assert replies[0] == [key, "a", 2]
    assert isinstance(replies[1], NoScriptError)
    assert isinstance(replies[2], ResponseError) and "planted failure" in str(replies[2])
    again = await evalsha_many(client, [(sha(ECHO), [key], ["b", 41.5])])
    assert again == [[key, "b", 42]]


async def test_replies_past_one_read_each_come_back_in_their_place(
    client: Redis, key_prefix: str
) -> None:
    """3,000 commands in one write, their replies about 3 MB (many reads of the
    socket): values, a nil and errors each in its place, and the connection in
    step for the next caller."""
    key = f"{key_prefix}:{{s}}:k"
    value = "v" * 3_000
    commands: list[tuple[str | int, ...]] = []
    for i in range(1_000):
        commands += [("SET", f"{key}:{i}", value), ("GET", f"{key}:{i}"), ("INCR", f"{key}:{i}")]
    commands[1_501] = ("GET", f"{key}:absent")
    replies = await commands_many(client, commands)
    assert len(replies) == 3_000
    for i in range(0, 3_000, 3):
        assert replies[i] == "OK", i
        assert replies[i + 1] == (None if i + 1 == 1_501 else value), i
        assert isinstance(replies[i + 2], ResponseError), i
        assert "not an integer" in str(replies[i + 2]), i
    assert await evalsha_many(client, [(sha(ECHO), [key], ["c", 1])]) == [[key, "c", 2]]


async def _connection_id(redis: Redis, name: str) -> int:
    """The id of the one connection named ``name``."""
    (found,) = [c["id"] for c in await redis.client_list() if c.get("name") == name]
    return int(found)


@pytest.mark.parametrize("retries", [0, 1])
async def test_a_killed_connection_is_replaced(redis: Redis, key_prefix: str, retries: int) -> None:
    """The server drops the pooled connection between two calls. With a retry
    the next call is sent again on a new connection and answered; without one
    (the gateway's client) it may fail with a ConnectionError (a 503 to the
    buyer), and the call after it is answered on a new connection."""
    name = f"test-scripts-{uuid.uuid4().hex[:8]}"
    client = named_client(name, retries)
    key = f"{key_prefix}:{{s}}:k"
    try:
        await client.script_load(ECHO)
        assert await evalsha_many(client, [(sha(ECHO), [key], ["x", 1])]) == [[key, "x", 2]]
        killed = await _connection_id(redis, name)
        await redis.client_kill_filter(_id=str(killed))
        try:
            replies = await evalsha_many(client, [(sha(ECHO), [key], ["y", 2])])
        except ConnectionError:
            assert not retries, "the retry did not send the call again"
        else:
            assert replies == [[key, "y", 3]]
        assert await evalsha_many(client, [(sha(ECHO), [key], ["z", 3])]) == [[key, "z", 4]]
        assert await _connection_id(redis, name) != killed
    finally:
        await client.aclose()


async def test_the_coalescer_says_which_calls_are_on_their_way(
    client: Redis, key_prefix: str
) -> None:
    """A group's entries are on their way from the turn they are queued until
    their callers have their replies: queued (an empty list), then the call in
    flight, then nothing once answered; another group's call is not this one's."""
    # One reply per entry, in order, as the coalescer wants.
    script = Script("tenfold", "local r = {} for i = 1, #ARGV do r[i] = ARGV[i] * 10 end return r")
    await script.load(client)
    key = f"{key_prefix}:{{s}}:k"

    def build(entries: list[int]) -> tuple[list[str], list[int]]:
        return [key], entries

    coalescer: ScriptCoalescer[int] = ScriptCoalescer(client, script, build)
    assert coalescer.on_the_way("a") is None
    calls = [asyncio.ensure_future(coalescer("a", i)) for i in (1, 2)]
    await asyncio.sleep(0)  # the callers queue their entries
    assert coalescer.on_the_way("a") == []
    assert coalescer.on_the_way("b") is None
    await asyncio.sleep(0)  # the turn's call goes out
    flying = coalescer.on_the_way("a")
    assert flying is not None and len(flying) == 1
    await asyncio.wait_for(asyncio.wait(flying), 5)
    assert all(c.done() for c in calls)
    assert [c.result() for c in calls] == [10, 20]
    assert coalescer.on_the_way("a") is None
