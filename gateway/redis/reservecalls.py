"""The arguments of the reserve scripts (``gateway.redis.inventory`` calls them): KEYS and
ARGV of one coalesced reserve.lua or enqueue.lua call for a sku's waiting purchases,
and the sku's leading ARGV (retention, sale window, effective rates).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from gateway.domain.model import Purchase, SkuInfo
from gateway.domain.rules import effective, epoch_ms
from gateway.redis.layout import SkuKeys, call_key, rejected_key, stream_key
from gateway.redis.scripts import ScriptArg
from gateway.settings import Settings

# A purchase waiting for its sku's next reserve.lua call: the purchase, its
# user's and its client's bucket keys ("" when that limit is off), the sku's
# leading ARGV (see :meth:`ReserveCalls.head`), and whether PostgreSQL cleared
# it while the sku's hashes are rebuilt (reserve.lua's "unverified").
Entry = tuple[Purchase, str, str, tuple[ScriptArg, ...], bool]


class ReserveCalls:
    """Builds reserve.lua's and enqueue.lua's KEYS and ARGV for one gateway's settings."""

    def __init__(self, settings: Settings, keys: Callable[[str], SkuKeys]) -> None:
        self._prefix = settings.key_prefix
        self._keys = keys
        self._retention_ms = max(1, round(settings.sale_retention_s * 1000))
        self._stream_max = settings.stream_max
        self._user_rate, self._client_rate = settings.user_rate_limit, settings.client_rate_limit
        self._heads: dict[str, tuple[SkuInfo, tuple[ScriptArg, ...]]] = {}

    def head(self, info: SkuInfo) -> tuple[ScriptArg, ...]:
        """reserve.lua's ARGV[1..7] for a sku: retention, window, effective rates;
        worked out once per catalog entry."""
        cached = self._heads.get(info.sku)
        if cached is not None and cached[0] is info:
            return cached[1]
        rules = info.rules
        user = effective(rules.user_rate, self._user_rate)
        client = effective(rules.client_rate, self._client_rate)
        starts, ends = epoch_ms(rules.starts_at), epoch_ms(rules.ends_at)
        head: tuple[ScriptArg, ...] = (
            self._retention_ms,
            "" if starts is None else starts,
            "" if ends is None else ends,
            0 if user is None else user.per_s,
            0 if user is None else user.burst,
            0 if client is None else client.per_s,
            0 if client is None else client.burst,
        )
        self._heads[info.sku] = (info, head)
        return head

    def reserve(self, entries: list[Entry]) -> tuple[list[str], list[ScriptArg]]:
        """One reserve.lua call for a sku's queued purchases: its four keys, the
        call's own key (a fresh id, so a call sent again is recognised), the
        rebuild key and the bucket keys (each once), the sku's head (the newest
        entry's), then six args per purchase."""
        sku = entries[0][0].sku
        sku_keys = self._keys(sku)
        call = call_key(self._prefix, sku, uuid.uuid4().hex)
        keys: list[str] = [*sku_keys.all(), call, sku_keys.rebuild]
        index: dict[str, int] = {}
        args: list[ScriptArg] = list(entries[-1][3])
        for purchase, user_key, client_key, _, verified in entries:
            args += (purchase.request_id, purchase.user_id, purchase.qty)
            for bucket in (user_key, client_key):
                if not bucket:
                    args.append(0)
                    continue
                at = index.get(bucket)
                if at is None:
                    keys.append(bucket)
                    at = index[bucket] = len(keys)
                args.append(at)
            args.append(1 if verified else 0)
        return keys, args

    def enqueue(self, entries: list[Entry]) -> tuple[list[str], list[ScriptArg]]:
        """One enqueue.lua call: reserve.lua's, then the stream and rejections
        keys last and the stream's bound as the last argument."""
        keys, args = self.reserve(entries)
        sku = entries[0][0].sku
        keys += (stream_key(self._prefix, sku), rejected_key(self._prefix, sku))
        args.append(self._stream_max)
        return keys, args
