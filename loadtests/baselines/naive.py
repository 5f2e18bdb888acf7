"""The naive baseline: what a first implementation of the purchase path does.

``python -m loadtests.baselines.naive --port P --database-url URL --redis-url URL --prefix P``
serves ``POST /v1/purchase`` with one round trip per step and no batching:

1. one EVALSHA (redis-py asyncio) that checks and decrements the sku's stock,
2. one transaction per purchase on an asyncpg pool: a guarded
   ``UPDATE inventory SET stock = stock - $2 WHERE sku = $1 AND stock >= $2``
   and an ``INSERT INTO orders``,
3. ``201`` only after that transaction committed.

It runs on the gateway's tables (``flashsale-gateway migrate`` first), so the
database work per order is the same as the gateway's, only not batched.
``PUT /admin/skus/{sku}`` ``{"stock": N}`` (no token: a loopback bench tool)
sets the database row and the Redis counter.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator, Sequence

import asyncpg
import orjson
from aiohttp import web
from redis.asyncio import BlockingConnectionPool, Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from loadtests.baselines.bare import (
    JSON,
    SOLD_OUT,
    BadRequest,
    bad_request,
    parse_purchase,
    read_body,
)
from loadtests.baselines.bare import serve as serve_app

# Checks and takes stock in one step; -1 when the sku has no counter.
RESERVE = """
local stock = redis.call("GET", KEYS[1])
if not stock then return -1 end
if tonumber(stock) < tonumber(ARGV[1]) then return 0 end
redis.call("DECRBY", KEYS[1], ARGV[1])
return 1
"""
# Guarded like every stock decrement: the database refuses an oversell even
# when Redis let one through.
TAKE_STOCK = "UPDATE inventory SET stock = stock - $2 WHERE sku = $1 AND stock >= $2"
INSERT_ORDER = """
INSERT INTO orders (request_id, sku, user_id, qty) VALUES ($1, $2, $3, $4)
RETURNING order_id::text
"""
PUT_SKU = """
INSERT INTO inventory (sku, stock, per_user_limit) VALUES ($1, $2, 1)
ON CONFLICT (sku) DO UPDATE SET stock = EXCLUDED.stock, updated_at = now()
"""

DATABASE = web.AppKey("database", asyncpg.Pool)
REDIS = web.AppKey("redis", Redis)
SCRIPT = web.AppKey("script", AsyncScript)
PREFIX = web.AppKey("prefix", str)

_DUPLICATE = orjson.dumps({"status": "duplicate"})
_UNAVAILABLE = orjson.dumps({"error": "unavailable"})
_UNKNOWN = orjson.dumps({"error": "unknown_sku"})


class _ShortStock(Exception):
    """The database had less stock than Redis: roll back, answer sold out."""


def stock_key(prefix: str, sku: str) -> str:
    """The Redis counter of a sku."""
    return f"{prefix}:{sku}:stock"


async def purchase(request: web.Request) -> web.Response:
    """POST /v1/purchase: reserve in Redis, then commit the order, one by one."""
    body = await read_body(request)
    if body is None:
        return web.Response(status=413)
    try:
        p = parse_purchase(body)
    except BadRequest as exc:
        return bad_request(exc)
    app = request.app
    redis, key = app[REDIS], stock_key(app[PREFIX], p["sku"])
    try:
        reserved = await app[SCRIPT](keys=[key], args=[p["qty"]], client=redis)
    except RedisError:
        return web.Response(body=_UNAVAILABLE, status=503, content_type=JSON)
    if reserved == -1:
        return web.Response(body=_UNKNOWN, status=404, content_type=JSON)
    if reserved == 0:
        return web.Response(body=SOLD_OUT, status=409, content_type=JSON)
    try:
        async with app[DATABASE].acquire() as con, con.transaction():
            if await con.execute(TAKE_STOCK, p["sku"], p["qty"]) != "UPDATE 1":
                raise _ShortStock
            order_id = await con.fetchval(
                INSERT_ORDER, p["request_id"], p["sku"], p["user_id"], p["qty"]
            )
    except _ShortStock:
        # Redis ran ahead of the database; its unit is not given back.
        return web.Response(body=SOLD_OUT, status=409, content_type=JSON)
    except asyncpg.UniqueViolationError:
        await _give_back(redis, key, p["qty"])
        return web.Response(body=_DUPLICATE, status=409, content_type=JSON)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError):
        await _give_back(redis, key, p["qty"])
        return web.Response(body=_UNAVAILABLE, status=503, content_type=JSON)
    order = {"status": "confirmed", "order_id": order_id, **p}
    return web.Response(body=orjson.dumps(order), status=201, content_type=JSON)


async def _give_back(redis: Redis, key: str, qty: int) -> None:
    # A bench tool: a unit lost here only lowers what is left to sell.
    with contextlib.suppress(RedisError):
        await redis.incrby(key, qty)


async def put_sku(request: web.Request) -> web.Response:
    """PUT /admin/skus/{sku} {"stock": N}: set database and Redis stock."""
    sku = request.match_info["sku"]
    data = orjson.loads(await request.read())
    stock = data.get("stock")
    if type(stock) is not int or stock < 0:
        return bad_request(BadRequest("stock must be a non-negative integer"))
    await request.app[DATABASE].execute(PUT_SKU, sku, stock)
    await request.app[REDIS].set(stock_key(request.app[PREFIX], sku), stock)
    return web.Response(body=orjson.dumps({"sku": sku, "stock": stock}), content_type=JSON)


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz: the process answers."""
    return web.Response(body=b'{"status":"ok"}', content_type=JSON)


def create_app(
    database_url: str, redis_url: str, prefix: str, db_pool_size: int, redis_pool_size: int
) -> web.Application:
    """The naive application; pools open on start-up and close on clean-up."""
    app = web.Application(client_max_size=4096)
    app[PREFIX] = prefix

    async def resources(app: web.Application) -> AsyncIterator[None]:
        pool = await asyncpg.create_pool(
            database_url, min_size=2, max_size=db_pool_size, command_timeout=10
        )
        assert pool is not None
        # Sized and blocking like the gateway's, so neither side gets more
        # Redis connections than the other.
        redis = Redis(
            connection_pool=BlockingConnectionPool.from_url(
                redis_url, max_connections=redis_pool_size, timeout=5
            )
        )
        app[DATABASE], app[REDIS] = pool, redis
        app[SCRIPT] = redis.register_script(RESERVE)
        yield
        await redis.aclose()
        await pool.close()

    app.cleanup_ctx.append(resources)
    app.add_routes(
        [
            web.post("/v1/purchase", purchase),
            web.put("/admin/skus/{sku}", put_sku),
            web.get("/healthz", healthz),
        ]
    )
    return app


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m loadtests.baselines.naive``."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.baselines.naive", description=__doc__
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8082)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--prefix", required=True, help="Redis key prefix")
    # The gateway's defaults (GATEWAY_DB_POOL_SIZE, GATEWAY_REDIS_POOL_SIZE).
    parser.add_argument("--db-pool-size", type=int, default=8)
    parser.add_argument("--redis-pool-size", type=int, default=64)
    args = parser.parse_args(argv)
    app = create_app(
        args.database_url, args.redis_url, args.prefix, args.db_pool_size, args.redis_pool_size
    )
    serve_app(app, args.host, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
