"""Typed keys of what the application holds (``app[KEY]``)."""

from __future__ import annotations

from aiohttp import web
from redis.asyncio import Redis

from gateway.admin import StockAdmin
from gateway.metrics import Metrics
from gateway.orders import Orders
from gateway.reconciler import Reconciler
from gateway.service import PurchaseService
from gateway.settings import Settings

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
REDIS = web.AppKey("redis", Redis)
ORDERS = web.AppKey("orders", Orders)
SERVICE = web.AppKey("service", PurchaseService)
ADMIN = web.AppKey("admin", StockAdmin)
RECONCILER = web.AppKey("reconciler", Reconciler)
# A purchase response carries its outcome to the metrics middleware.
OUTCOME = web.ResponseKey("outcome", str)
