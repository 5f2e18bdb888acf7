"""Confirmed orders written straight into a sku's Redis hashes, as a finished sale leaves them.

The memory benchmarks need a sale of a million orders in Redis without selling
it: the done and buyers hashes are written here in the gateway's record
formats (``gateway.redis.layout``). A counter set afterwards with
``StockLoad.FRESH`` trusts them, so no reservation runs against empty hashes.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.domain.model import Order
from gateway.redis.connections import RedisClient
from gateway.redis.layout import SkuKeys, encode_confirmed
from gateway.settings import Settings

# Orders written per round trip.
CHUNK = 1000


async def write_confirmed(
    redis: RedisClient, settings: Settings, sku: str, orders: Sequence[Order]
) -> None:
    """Write ``orders`` of ``sku`` into its done and buyers hashes, which expire
    as the gateway's do (``GATEWAY_SALE_RETENTION_S``)."""
    keys = SkuKeys.of(settings.key_prefix, sku)
    retention_ms = max(1, round(settings.sale_retention_s * 1000))
    for start in range(0, len(orders), CHUNK):
        chunk = orders[start : start + CHUNK]
        pipe = redis.pipeline(transaction=False)
        pipe.hset(keys.done, mapping={o.request_id: encode_confirmed(o) for o in chunk})
        pipe.hset(keys.buyers, mapping={o.user_id: o.request_id for o in chunk})
        pipe.pexpire(keys.done, retention_ms)
        pipe.pexpire(keys.buyers, retention_ms)
        await pipe.execute()
