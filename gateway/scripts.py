"""Lua scripts from ``lua/``: loaded once at start-up, called by EVALSHA.

Each script is registered with SCRIPT LOAD when the application starts, so a
syntax error fails the start rather than the first purchase. Calls go out as
EVALSHA; a ``NOSCRIPT`` reply (Redis restarted, or SCRIPT FLUSH) reloads the
script and retries once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

LUA_DIR = Path(__file__).resolve().parent.parent / "lua"

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

    async def load(self, redis: Redis) -> None:
        """Register the script with Redis (SCRIPT LOAD); raises on a syntax error."""
        sha = await redis.script_load(self.source)
        if sha != self.sha:  # pragma: no cover - Redis hashes exactly as we do
            raise RuntimeError(f"script {self.name}: Redis reported sha {sha}")

    async def __call__(
        self, redis: Redis, keys: Sequence[KeyArg], args: Sequence[ScriptArg]
    ) -> Any:
        """Run the script by EVALSHA, reloading it once if Redis forgot it."""
        try:
            return await redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            if self.on_reload is not None:
                self.on_reload(self.name)
            await self.load(redis)
            return await redis.evalsha(self.sha, len(keys), *keys, *args)


def read_script(name: str, lua_dir: Path = LUA_DIR) -> Script:
    """Read ``lua/<name>.lua`` into a :class:`Script` (not yet loaded)."""
    return Script(name=name, source=(lua_dir / f"{name}.lua").read_text())
