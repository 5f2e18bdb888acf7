"""Lua scripts from ``lua/`` (package data ``gateway.lua``): loaded once, called by EVALSHA.

Each script is registered with SCRIPT LOAD when the application starts, so a
syntax error fails the start rather than the first purchase. Calls go out as
EVALSHA; a ``NOSCRIPT`` reply (Redis restarted, or SCRIPT FLUSH) reloads the
script and retries once.

On a Redis Cluster SCRIPT LOAD goes to every primary (redis-py's routing of
that command), and a replica promoted by a failover, which never had the
scripts, answers NOSCRIPT once and is loaded the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError

from gateway.connections import RedisClient
from gateway.lock.errors import connection_errors

# The repository's top-level lua/, installed as the package gateway.lua (see pyproject.toml).
LUA_DIR: Traversable = resources.files("gateway.lua")

KeyArg = str | bytes
ScriptArg = str | bytes | int | float


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
                return await redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            if self.on_reload is not None:
                self.on_reload(self.name)
            await self.load(redis)
            with connection_errors():
                return await redis.evalsha(self.sha, len(keys), *keys, *args)


def read_script(name: str, lua_dir: Traversable = LUA_DIR) -> Script:
    """Read ``lua/<name>.lua`` into a :class:`Script` (not yet loaded)."""
    return Script(name=name, source=(lua_dir / f"{name}.lua").read_text())


def read_composed(name: str, inner: str, lua_dir: Traversable = LUA_DIR) -> Script:
    """``lua/<name>.lua`` preceded by ``lua/<inner>.lua`` wrapped as the local
    function ``<inner>()``: one script that calls another's whole body, so the
    two run atomically and the inner one's logic is not copied."""
    body = (lua_dir / f"{inner}.lua").read_text()
    outer = (lua_dir / f"{name}.lua").read_text()
    return Script(name=name, source=f"local function {inner}()\n{body}\nend\n{outer}")


class AutoPipeline:
    """Coalesces the calls of one script made in one event-loop turn into one pipeline.

    Under a storm many requests reach the same script within a loop iteration;
    sending them as one pipeline costs one connection checkout and one write
    instead of one per request. Replies come back in order; a NOSCRIPT reply
    reloads the script and retries that call alone. On a Redis Cluster the
    pipeline is split by node, one write per node, each call routed by its keys'
    slot; a node that forgot the script answers NOSCRIPT for its calls only.
    """

    def __init__(self, redis: RedisClient, script: Script) -> None:
        self._redis = redis
        self._script = script
        self._queue: list[tuple[Sequence[KeyArg], Sequence[ScriptArg], asyncio.Future[Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, keys: Sequence[KeyArg], args: Sequence[ScriptArg]) -> Any:
        """Run the script with these keys and args, in the next pipeline."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._queue:
            loop.call_soon(self._send)
        self._queue.append((keys, args, future))
        return await future

    def _send(self) -> None:
        batch, self._queue = self._queue, []
        task = asyncio.ensure_future(self._execute(batch))
        # Keep a reference until done: the loop only holds tasks weakly.
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(
        self, batch: list[tuple[Sequence[KeyArg], Sequence[ScriptArg], asyncio.Future[Any]]]
    ) -> None:
        sha = self._script.sha
        pipe = self._redis.pipeline(transaction=False)
        for keys, args, _ in batch:
            # Not pipe.evalsha: a cluster pipeline refuses it, since it cannot know
            # the keys share a slot; execute_command routes EVALSHA by its keys.
            pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except Exception as exc:  # the connection failed: every caller learns why
            if not isinstance(exc, RedisError):
                # redis-py 8.1's cluster pipeline can fail with a bare AttributeError
                # when a failover closes a connection it is writing on: a lost connection.
                exc = RedisConnectionError(f"pipeline failed: {exc!r}")
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (keys, args, future), reply in zip(batch, replies, strict=True):
            if isinstance(reply, NoScriptError):
                reply = await _settle(self._script(self._redis, keys, args))
            if future.done():
                continue
            if isinstance(reply, BaseException):
                future.set_exception(reply)
            else:
                future.set_result(reply)


async def _settle(awaitable: Awaitable[Any]) -> Any:
    """The awaitable's result, or the exception it raised, as a value."""
    try:
        return await awaitable
    except Exception as exc:
        return exc
