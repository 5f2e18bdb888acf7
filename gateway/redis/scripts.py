"""Lua scripts from ``lua/`` (package data ``gateway.lua``): loaded once, called by EVALSHA.

Each script is registered with SCRIPT LOAD when the application starts, so a
syntax error fails the start rather than the first purchase. Calls go out as
EVALSHA; a ``NOSCRIPT`` reply (Redis restarted, or SCRIPT FLUSH) reloads the
script and retries once.

On a Redis Cluster SCRIPT LOAD goes to every primary (redis-py's routing of
that command), and a replica promoted by a failover, which never had the
scripts, answers NOSCRIPT once and is loaded the same way.

The calls themselves (:func:`evalsha_many`) skip redis-py's command layer on a
single Redis or a Sentinel-named primary: hiredis packs them (its C packer,
far faster than redis-py's own; docs/performance.md has the figure) and
they go out on one pooled connection in one write, their replies read in turn.
The connection, its parser and its retries on a lost connection stay redis-py's.
On the in-stock path redis-py's packing, pipeline and observability hooks were
a large part of the gateway's CPU (docs/performance.md). A Redis Cluster keeps
redis-py's pipeline, which routes each call by its slot.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Generic, TypeVar

import hiredis
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.lock import connection_errors
from gateway.redis.connections import RedisClient

# The repository's top-level lua/, installed as the package gateway.lua (see pyproject.toml).
LUA_DIR: Traversable = resources.files("gateway.lua")

KeyArg = str | bytes
ScriptArg = str | bytes | int | float
# One call waiting in a ScriptCoalescer (whatever its build function takes).
E = TypeVar("E")
# One EVALSHA: the script's sha, its keys and its args.
Call = tuple[str, Sequence[KeyArg], Sequence[ScriptArg]]


async def evalsha_many(redis: RedisClient, calls: Sequence[Call]) -> list[Any]:
    """Run ``calls`` as EVALSHAs in one round trip: per call its reply, or the
    ``ResponseError`` Redis answered (``NoScriptError`` included), or on a
    cluster the ``RedisError`` of that call's node (its connection failed
    while another node's calls went through). Raises a
    ``RedisError`` when the connection fails, after the client's own retries
    (which send the calls again: a reserve call is recognised by its call key)."""
    # Not pipe.evalsha on a cluster: a cluster pipeline refuses it, since it
    # cannot know the keys share a slot; execute_command routes EVALSHA by its keys.
    return await commands_many(
        redis, [("EVALSHA", sha, len(keys), *keys, *args) for sha, keys, args in calls]
    )


async def commands_many(
    redis: RedisClient, commands: Sequence[Sequence[ScriptArg]], *, node_of: str | None = None
) -> list[Any]:
    """Send ``commands`` in one round trip, packed by hiredis on a single Redis
    (a cluster's pipeline routes each by its key, or every one to the node of
    ``node_of``: a keyless WAIT must follow its writes on their connection);
    per command its reply or the ``ResponseError`` Redis answered. Raises a
    ``RedisError`` when the connection fails, after the client's own retries
    (which send every command again)."""
    if not isinstance(redis, Redis):
        pipe = redis.pipeline(transaction=False)
        routed = {} if node_of is None else {"target_nodes": redis.get_node_from_key(node_of)}
        for command in commands:
            pipe.execute_command(*command, **routed)
        return await pipe.execute(raise_on_error=False)
    return await packed_many(redis, b"".join(map(pack, commands)), len(commands))


def pack(command: Sequence[ScriptArg]) -> bytes:
    """One command as Redis reads it (RESP), packed by hiredis."""
    # hiredis's stub types the command as a 1-tuple; it takes any length.
    packed: bytes = hiredis.pack_command(tuple(command))  # type: ignore[arg-type]
    return packed


async def packed_many(redis: Redis, packed: bytes, count: int) -> list[Any]:
    """Send ``count`` commands already packed (RESP) to a single Redis in one
    round trip; per command its reply or the ``ResponseError`` Redis answered.
    Raises a ``RedisError`` when the connection fails, after the client's own
    retries (which send every command again)."""
    pool = redis.connection_pool
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        replies: list[Any] = await conn.retry.call_with_retry(
            lambda: _exchange(conn, packed, count), lambda _: conn.disconnect()
        )
        return replies
    finally:
        await pool.release(conn)


async def _exchange(conn: AbstractConnection, packed: bytes, count: int) -> list[Any]:
    # read_response drops the connection on any other error, so nothing is
    # left unread on a connection that goes back to the pool.
    await _send(conn, packed)
    replies: list[Any] = []
    while len(replies) < count:
        try:
            replies.append(await conn.read_response())
        except ResponseError as exc:
            replies.append(exc)
        if len(replies) < count:
            await _take_buffered(conn, replies, count)
    return replies


async def _take_buffered(conn: AbstractConnection, replies: list[Any], count: int) -> None:
    """Add to ``replies``, up to ``count``, those already read off the socket.

    ``read_response`` costs about 5 µs a reply whether or not its bytes are
    there (a timeout scope, the peer's name formatted for an error that does not
    come, the health check's clock): more than an XADD costs Redis, on the
    relay's 256 appends a claim (docs/performance.md, "Order events").
    A reply already in hiredis's buffer is taken from it here as redis-py's
    hiredis parser takes it: an error reply as the ``ResponseError`` it reads
    as, a lost connection (or LOADING) raised after the disconnect, a RESP3
    push handed to the parser's handler. ``tests/unit/test_library_reaches.py``
    holds that code to redis-py 8.1.0's."""
    parser = conn._parser
    reader = parser._reader if isinstance(parser, _AsyncHiredisParser) else None
    if reader is None:
        return
    push = parser._hiredis_PushNotificationType
    try:
        while len(replies) < count:
            reply = reader.gets()
            if reply is NOT_ENOUGH_DATA:
                return
            if isinstance(reply, list) and reply and isinstance(reply[0], RedisConnectionError):
                raise reply[0]
            if isinstance(reply, RedisConnectionError):
                raise reply
            if push is not None and isinstance(reply, push):
                await parser.handle_push_response(reply)
                continue
            replies.append(reply)
    except BaseException:
        await conn.disconnect(nowait=True)
        raise


async def _send(conn: AbstractConnection, packed: bytes) -> None:
    """Write ``packed`` on ``conn`` in this task, as ``send_packed_command`` would.

    redis-py bounds the write by its socket timeout with ``asyncio.wait_for``,
    which on Python 3.11 runs it as a task of its own: the calls then leave a
    turn of the event loop later, behind every callback ready by then and a
    poll of every socket (what that cost is in docs/performance.md). Here
    ``asyncio.timeout`` bounds it in the caller's task; all else is redis-py
    8.1.0's ``send_packed_command`` line for line (the connect, the health
    check, the disconnect on a failed write, the errors raised), which
    ``tests/unit/test_library_reaches.py`` holds it to: redis is pinned to that
    release in pyproject.toml.
    """
    if not conn.is_connected:
        await conn.connect_check_health(check_health=False)
    await conn.check_health()  # type: ignore[no-untyped-call]
    try:
        # A socket timeout of None or 0 leaves the write unbounded, as redis-py does.
        async with asyncio.timeout(conn.socket_timeout or None):
            await conn._send_packed_command([packed])
    except TimeoutError:
        await conn.disconnect(nowait=True)
        raise RedisTimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        await conn.disconnect(nowait=True)
        err_no, errmsg = ("UNKNOWN", exc.args[0]) if len(exc.args) == 1 else exc.args[:2]
        raise RedisConnectionError(f"Error {err_no} while writing to socket. {errmsg}.") from exc
    except BaseException:
        # Cancelled mid-write: what was sent of the command is unknown.
        await conn.disconnect(nowait=True)
        raise


async def _evalsha(
    redis: RedisClient, sha: str, keys: Sequence[KeyArg], args: Sequence[ScriptArg]
) -> Any:
    (reply,) = await evalsha_many(redis, [(sha, keys, args)])
    if isinstance(reply, BaseException):
        raise reply
    return reply


@dataclass(slots=True)
class Script:
    """One Lua script, called by its SHA1 and reloaded on NOSCRIPT."""

    name: str
    source: str
    sha: str = field(init=False)
    on_reload: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    async def load(self, redis: RedisClient) -> None:
        """Register the script with Redis (SCRIPT LOAD); raises on a syntax error."""
        sha = await redis.script_load(self.source)
        if sha != self.sha:  # pragma: no cover - Redis hashes exactly as we do
            raise RuntimeError(f"script {self.name}: Redis reported sha {sha}")

    async def __call__(
        self, redis: RedisClient, keys: Sequence[KeyArg], args: Sequence[ScriptArg]
    ) -> Any:
        """Run the script by EVALSHA, reloading it once if Redis forgot it."""
        try:
            with connection_errors():
                return await _evalsha(redis, self.sha, keys, args)
        except NoScriptError:
            if self.on_reload is not None:
                self.on_reload(self.name)
            await self.load(redis)
            with connection_errors():
                return await _evalsha(redis, self.sha, keys, args)


def read_script(name: str) -> Script:
    """Read ``lua/<name>.lua`` into a :class:`Script` (not yet loaded)."""
    return Script(name=name, source=(LUA_DIR / f"{name}.lua").read_text())


def read_composed(name: str, inner: str) -> Script:
    """``lua/<name>.lua`` preceded by ``lua/<inner>.lua`` wrapped as the local
    function ``<inner>()``: one script that calls another's whole body, so the
    two run atomically and the inner one's logic is not copied."""
    body = (LUA_DIR / f"{inner}.lua").read_text()
    outer = (LUA_DIR / f"{name}.lua").read_text()
    return Script(name=name, source=f"local function {inner}()\n{body}\nend\n{outer}")


class ScriptCoalescer(Generic[E]):
    """Coalesces the calls of one script made in one event-loop turn: one script
    call per group (a sku), and every group's call in one pipeline.

    Under a storm many requests reach the same script within a loop iteration.
    Each group's entries go to the script as one call, whose reply is an array
    with one reply per entry, in order: one command to encode, one reply to
    parse and one slot to route per sku instead of one per request. ``build``
    turns a group's entries into the call's keys and args; every key must be in
    the group's cluster slot (the ``{sku}`` hash tag). A NOSCRIPT reply reloads
    the script and retries that group's call alone. On a Redis Cluster the
    pipeline is split by node, one write per node.
    """

    def __init__(
        self,
        redis: RedisClient,
        script: Script,
        build: Callable[[list[E]], tuple[Sequence[KeyArg], Sequence[ScriptArg]]],
    ) -> None:
        self._redis = redis
        self._script = script
        self._build = build
        self._groups: dict[str, list[tuple[E, asyncio.Future[Any]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # The calls in flight, by the groups they carry (see on_the_way).
        self._flying: dict[str, set[asyncio.Task[None]]] = {}

    def on_the_way(self, group: str) -> list[asyncio.Task[None]] | None:
        """The calls in flight that carry entries of ``group``; an empty list
        when its entries go out at the end of this loop turn; None when it has
        nothing on its way. Their callers hear their replies before a waiter on
        these calls wakes: the replies are handed out first (asyncio wakes
        callbacks in order)."""
        if group in self._groups:
            return []
        flying = self._flying.get(group)
        return list(flying) if flying else None

    async def __call__(self, group: str, entry: E) -> Any:
        """Run the script for ``entry`` in its group's next call; its own reply."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._groups:
            loop.call_soon(self._send)
        queued = self._groups.get(group)
        if queued is None:
            self._groups[group] = [(entry, future)]
        else:
            queued.append((entry, future))
        return await future

    def _send(self) -> None:
        names, groups = list(self._groups), list(self._groups.values())
        self._groups = {}
        task = asyncio.ensure_future(self._execute(groups))
        # Keep a reference until done: the loop only holds tasks weakly.
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        for name in names:
            self._flying.setdefault(name, set()).add(task)
        task.add_done_callback(lambda done: self._landed(names, done))

    def _landed(self, names: list[str], task: asyncio.Task[None]) -> None:
        for name in names:
            flying = self._flying.get(name)
            if flying is not None:
                flying.discard(task)
                if not flying:
                    del self._flying[name]

    async def _execute(self, groups: list[list[tuple[E, asyncio.Future[Any]]]]) -> None:
        sha = self._script.sha
        calls = [self._build([entry for entry, _ in group]) for group in groups]
        try:
            with connection_errors():
                replies = await evalsha_many(self._redis, [(sha, k, a) for k, a in calls])
        except Exception as exc:  # the connection failed: every caller learns why
            if not isinstance(exc, RedisError):
                # redis-py 8.1's cluster pipeline can fail with a bare AttributeError
                # when a failover closes a connection it is writing on: a lost connection.
                exc = RedisConnectionError(f"pipeline failed: {exc!r}")
            replies = [exc] * len(groups)
        for group, (keys, args), reply in zip(groups, calls, replies, strict=True):
            if isinstance(reply, NoScriptError):
                reply = await _as_value(self._script(self._redis, keys, args))
            _resolve(group, reply)


def _resolve(group: list[tuple[E, asyncio.Future[Any]]], reply: Any) -> None:
    """Hand each entry of a group its reply, or every entry the group's error."""
    if not isinstance(reply, BaseException) and (
        not isinstance(reply, list) or len(reply) != len(group)
    ):
        # Never leave a caller waiting on a reply that will not come.
        reply = ResponseError(f"expected {len(group)} replies, got {reply!r:.200}")
    if isinstance(reply, BaseException):
        for _, future in group:
            if not future.done():
                future.set_exception(reply)
        return
    for (_, future), own in zip(group, reply, strict=True):
        if not future.done():
            future.set_result(own)


async def _as_value(awaitable: Awaitable[Any]) -> Any:
    """The awaitable's result, or the exception it raised, as a value."""
    try:
        return await awaitable
    except Exception as exc:
        return exc
