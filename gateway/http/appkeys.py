"""Typed keys of what the application holds (``app[KEY]``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.http.admin_tokens import AdminTokens
from gateway.http.clients import TrustedProxies
from gateway.http.middlewares import Answer
from gateway.http.waiting_page import WaitingPage
from gateway.ops.answer_log import AnswerLog
from gateway.ops.metrics import Metrics
from gateway.postgres.database import Pool
from gateway.postgres.orders import Orders
from gateway.redis.connections import RedisClient
from gateway.redis.reservations import Reservations
from gateway.settings import Settings
from gateway.usecases.admin import StockAdmin
from gateway.usecases.admission import Admissions
from gateway.usecases.catalog import Catalog
from gateway.usecases.lifecycle import OrderLifecycle
from gateway.usecases.ports import BotCheck
from gateway.usecases.purchases import Purchases
from gateway.usecases.reconciler import Reconciler
from gateway.usecases.servable import Servability
from gateway.usecases.tracking import OrderTracker
from gateway.write.batcher import Batcher
from gateway.write.lanes import HostLanes

if TYPE_CHECKING:
    from gateway.lock.zk_session import ZkSession

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
REDIS = web.AppKey[RedisClient]("redis")
RESERVATIONS = web.AppKey("reservations", Reservations)
ORDERS = web.AppKey("orders", Orders)
# The PostgreSQL pool itself, for what takes connections of its own (locks, strategies).
POOL: web.AppKey[Pool[Any]] = web.AppKey("pool")
# The batcher's closing is the instance's draining: purchases and /readyz ask it.
BATCHER = web.AppKey("batcher", Batcher)
# With several workers, the host's lanes: /readyz waits for them to link.
LANES = web.AppKey[HostLanes | None]("lanes")
# Set on the stop signal: /readyz answers 503 from then on (lame duck, then drain).
STOPPING = web.AppKey("stopping", asyncio.Event)
PROXIES = web.AppKey("proxies", TrustedProxies)
PURCHASES = web.AppKey("purchases", Purchases)
# What the gateway knows of each sku (GET /v1/skus/{sku}).
CATALOG = web.AppKey("catalog", Catalog)
ADMIN = web.AppKey("admin", StockAdmin)
RECONCILER = web.AppKey("reconciler", Reconciler)
# Waiting rooms in front of the purchases, and the admin tokens (with their file).
ADMISSIONS = web.AppKey("admissions", Admissions)
ADMIN_TOKENS = web.AppKey("admin_tokens", AdminTokens)
# The waiting rooms' bot check (gateway.outbound.bot_check), or the one nobody passes.
BOT_CHECK = web.AppKey[BotCheck]("bot_check")
# The configured skus this instance could not serve (GET /readyz).
SERVABILITY = web.AppKey("servability", Servability)
# What became of a request id (GET /v1/orders/{request_id}).
TRACKER = web.AppKey("tracker", OrderTracker)
LIFECYCLE = web.AppKey("lifecycle", OrderLifecycle)
# The ZooKeeper session of the flush locks (None unless GATEWAY_FLUSH_LOCK=zookeeper).
ZOOKEEPER: web.AppKey[ZkSession | None] = web.AppKey("zookeeper")
# Samples per-request failure lines and logs the once-a-second answer summary.
ANSWERS = web.AppKey("answers", AnswerLog)
# The waiting-room page, assembled once (GET /wait/{sku}).
WAITING_PAGE = web.AppKey("waiting_page", WaitingPage)
# How every request is answered (errors as JSON, counted, timed): the
# middleware and the fast path share it.
ANSWER: web.AppKey[Answer] = web.AppKey("answer")
