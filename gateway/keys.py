"""Typed keys of what the application holds (``app[KEY]``)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web
from redis.asyncio import Redis

from gateway.admin import StockAdmin
from gateway.orders import Orders
from gateway.service import PurchaseService
from gateway.settings import Settings


@dataclass(slots=True)
class AppState:
    """Mutable run state of one application."""

    draining: bool = False


SETTINGS = web.AppKey("settings", Settings)
STATE = web.AppKey("state", AppState)
REDIS = web.AppKey("redis", Redis)
ORDERS = web.AppKey("orders", Orders)
SERVICE = web.AppKey("service", PurchaseService)
ADMIN = web.AppKey("admin", StockAdmin)
