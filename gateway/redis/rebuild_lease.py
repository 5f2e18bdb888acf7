"""The rebuild lease of a sku's buyers and done hashes: the only caller of ``lua/rebuild.lua``.

``load_stock.lua`` flags a sku as rebuilding when it sets a missing counter;
from then on the sku's rebuild key says the two hashes are incomplete, and
whoever holds its lease writes PostgreSQL's orders back into them
(``gateway.usecases.rebuilds``). The lease is checked against Redis's clock,
so every instance shares one. Driver errors become
:class:`gateway.domain.errors.RedisUnavailable`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway.redis.connections import RedisClient, redis_call
from gateway.redis.layout import KeyTags, SkuKeys
from gateway.redis.scripts import ScriptArg, read_script
from gateway.settings import Settings


class RebuildLease:
    """Whether a sku's hashes are rebuilt, and the lease of the one instance
    rebuilding them."""

    def __init__(
        self,
        redis: RedisClient,
        settings: Settings,
        on_noscript: Callable[[str], None] | None = None,
        tags: KeyTags | None = None,
    ) -> None:
        self._redis = redis
        # Each sku's limit group, which tags its keys (gateway.redis.layout).
        self._tags = KeyTags() if tags is None else tags
        self._prefix = settings.key_prefix
        self._retention_ms = max(1, round(settings.sale_retention_s * 1000))
        self._script = read_script("rebuild")
        self._script.on_reload = on_noscript

    async def load_scripts(self) -> None:
        """SCRIPT LOAD rebuild.lua; a syntax error raises here, at start-up."""
        await self._script.load(self._redis)

    def _keys(self, sku: str) -> SkuKeys:
        return SkuKeys.of(self._prefix, sku, self._tags.group_of(sku))

    async def rebuilding(self, sku: str) -> bool:
        """Whether the sku's buyers and done hashes are being rebuilt (incomplete)."""
        return bool(await redis_call(self._redis.exists(self._keys(sku).rebuild)))

    async def take(self, sku: str, owner: str, lease_ms: int) -> bool:
        """Take the sku's lease for ``owner``: when the sku is flagged and nobody
        holds the lease, or its holder's ran out."""
        return await self._step(sku, "take", owner, lease_ms)

    async def write(self, sku: str, owner: str, lease_ms: int, fields: Sequence[str]) -> bool:
        """Write orders, given flat as ``request_id, done record, user_id`` each
        (``Orders.order_page``), into the buyers and done hashes and renew the
        lease; False, writing nothing, when ``owner`` no longer holds it."""
        return await self._step(sku, "write", owner, lease_ms, fields)

    async def finish(self, sku: str, owner: str) -> bool:
        """End ``owner``'s rebuild: reservations trust the hashes again."""
        return await self._step(sku, "finish", owner, 0)

    async def _step(
        self, sku: str, step: str, owner: str, lease_ms: int, fields: Sequence[str] = ()
    ) -> bool:
        keys = self._keys(sku)
        args: tuple[ScriptArg, ...] = (step, owner, lease_ms, self._retention_ms, *fields)
        called = self._script(self._redis, (keys.rebuild, keys.buyers, keys.done), args)
        return bool(await redis_call(called))
