"""Selling a bench sku out before its sold-out path is measured, and what the sale left.

A sale is sold the way a real one is: wrk sends purchases of new users (each
request a new user and request id, ``purchase.lua``) until the gateway reports
nothing available and nothing pending. What it left behind is measured too:
the Redis memory of the sku's keys and the gateway's memory.
"""

from __future__ import annotations

import time
from typing import Any

from redis import Redis

from gateway.redis.layout import SkuKeys
from loadtests.lib import wrk
from loadtests.lib.bench_checks import wait_settled
from loadtests.lib.bench_paths import BIG_SKU, SMALL_SALE, SOLD_OUT_SKU
from loadtests.lib.harness import Harness
from loadtests.lib.pinning import Pinning
from loadtests.lib.targets import Target
from testkit.http import http

# Each wrk run sells for at most this long, then the stock left is read again.
SELL_CHUNK_S = 20.0
# Slower than this (units a second) and the sale is taken as stuck.
SLOWEST_SALE = 100.0


def available(target: Target, sku: str) -> int:
    """``GET /v1/skus/{sku}``: units left to reserve."""
    status, body = http("GET", f"{target.url}/v1/skus/{sku}")
    if status != 200 or not isinstance(body, dict):
        raise RuntimeError(f"{target.name}: GET /v1/skus/{sku} answered {status} {body}")
    return int(body["available"])


def sell_out(
    target: Target, sku: str, units: int, *, connections: int, pinning: Pinning, tag: str
) -> dict[str, Any]:
    """Sell every unit of ``sku`` (``units`` of them) to new users; how it went."""
    started = time.monotonic()
    deadline = started + 60 + units / SLOWEST_SALE
    requests = runs = 0
    while (left := available(target, sku)) > 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{target.name}: {left} units of {sku} still unsold")
        seconds = min(SELL_CHUNK_S, max(1.0, left / 1000))
        raw = wrk.run(
            target.url,
            sku=sku,
            tag=f"{tag}s{runs}",
            duration_s=seconds,
            connections=connections,
            threads=1,
            pinning=pinning,
        )
        requests += int(raw["requests"])
        runs += 1
    report = wait_settled(target, sku)
    return {
        "sku": sku,
        "units": units,
        "seconds": round(time.monotonic() - started, 1),
        "requests": requests,
        "settled": report,
    }


def sell_sales(
    harness: Harness,
    targets: dict[str, Target],
    big_stock: int,
    *,
    connections: int,
    pinning: Pinning,
) -> dict[str, Any]:
    """Sell the small sales and the big one out; what each took and left behind."""
    sales: dict[str, Any] = {}
    for name in ("gateway", "nometrics"):
        sales[f"{name}/small"] = sell_out(
            targets[name],
            SOLD_OUT_SKU,
            SMALL_SALE,
            connections=connections,
            pinning=pinning,
            tag=f"{harness.run_id}a",
        )
    print(f"  selling {big_stock:,} units of {BIG_SKU} to new users ...", flush=True)
    gateway = targets["gateway"]
    big = sell_out(
        gateway,
        BIG_SKU,
        big_stock,
        connections=connections,
        pinning=pinning,
        tag=f"{harness.run_id}b",
    )
    big["redis_bytes"] = redis_bytes(harness.redis_url, f"{harness.key_prefix}:gateway", BIG_SKU)
    big["redis_bytes_per_order"] = round(big["redis_bytes"]["total"] / big_stock, 1)
    big["gateway_memory_after_sale"] = gateway.memory()
    print(
        f"  sold in {big['seconds']} s; Redis keeps {big['redis_bytes']['total'] / 2**20:.1f} MiB"
        f" ({big['redis_bytes_per_order']} B/order)",
        flush=True,
    )
    sales["gateway/big"] = big
    return sales


def redis_bytes(redis_url: str, prefix: str, sku: str) -> dict[str, int]:
    """``MEMORY USAGE`` of each of the sku's keys (exact: SAMPLES 0), in bytes."""
    keys = SkuKeys.of(prefix, sku)
    names = ("stock", "buyers", "pending", "done")
    with Redis.from_url(redis_url) as redis:
        sizes = {
            name: int(redis.memory_usage(key, samples=0) or 0)
            for name, key in zip(names, keys.all(), strict=True)
        }
    sizes["total"] = sum(sizes.values())
    return sizes
