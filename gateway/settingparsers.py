"""How each setting is read from its text (``gateway.settings``): one parser a
field, each raising ValueError with a short reason that :func:`gateway.settings.load`
turns into a one-line :class:`gateway.settings.SettingsError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from gateway.domain.model import Strategy
from gateway.domain.rules import parse_rate
from gateway.http.clients import parse_networks
from gateway.http.waiting_page import parse_origins


def _int(low: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw)
        if value < low:
            raise ValueError(f"must be >= {low}")
        return value

    return parse


def _float(low: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        value = float(raw)
        if not value >= low:  # also rejects nan
            raise ValueError(f"must be >= {low}")
        return value

    return parse


def _share(raw: str) -> float:
    value = float(raw)
    if not 0 < value <= 1:  # also rejects nan
        raise ValueError("must be > 0 and <= 1")
    return value


def _choice(*options: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return raw

    return parse


def _url(*schemes: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if urlsplit(raw).scheme not in schemes:
            raise ValueError(f"must be a URL with scheme {' or '.join(schemes)}")
        return raw

    return parse


def _bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


def _addresses(raw: str) -> str:
    for part in raw.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError("must be host:port[,host:port...]")
    return raw


def _networks(raw: str) -> str:
    try:
        parse_networks(raw)
    except ValueError:
        raise ValueError("must be CIDRs or addresses, comma-separated") from None
    return raw


def _rate(raw: str) -> str:
    parse_rate(raw)
    return raw


def _text(raw: str) -> str:
    if not raw or any(c.isspace() for c in raw):
        raise ValueError("must be non-empty without spaces")
    return raw


def _file(raw: str) -> str:
    if not os.path.isfile(raw):
        raise ValueError("must name a readable file")
    return raw


def _secret(raw: str) -> str:
    # An HMAC key guessable by brute force would let anyone mint admission tokens.
    if len(raw) < 16 or any(c.isspace() for c in raw):
        raise ValueError("must be at least 16 characters without spaces")
    return raw


def _writer_block(value: int) -> int:
    # The Redis client's socket timeout is 5 s: a longer block would read as a timeout.
    if value > 4000:
        raise ValueError("must be <= 4000")
    return value


# One parser a field of gateway.settings.Settings: raw text in, the value out;
# ValueError with a short reason when the text will not do.
PARSERS: Mapping[str, Callable[[str], Any]] = {
    "host": _text,
    "port": _int(0),
    "redis_url": _url("redis", "rediss", "unix"),
    "database_url": _url("postgres", "postgresql"),
    "redis_sentinels": _addresses,
    "redis_sentinel_master": _text,
    "redis_cluster_nodes": _addresses,
    "key_prefix": _text,
    "admin_token": _text,
    "batch_max": _int(1),
    "batch_wait_ms": _float(0.0),
    "reservation_timeout_s": _float(0.1),
    "flush_lock": _choice("redis", "postgres", "zookeeper", "none"),
    "lock_lease_s": _float(0.05),
    "queue_max": _int(1),
    "redis_pool_size": _int(1),
    "db_pool_size": _int(2),
    "drain_s": _float(0.0),
    "lame_duck_s": _float(0.0),
    "trusted_proxies": _networks,
    "startup_wait_s": _float(0.0),
    "reconcile_interval_s": _float(0.05),
    "sale_retention_s": _float(1.0),
    "rebuild_share": _share,
    "log_level": _choice("debug", "info", "warning", "error"),
    "metrics": _bool,
    "loop_stall_report_s": _float(0.0),
    "workers": _int(1),
    "multiproc_dir": _text,
    "admin_token_file": _file,
    "admission_secret": _secret,
    "admission_secret_previous": _secret,
    "request_read_timeout_s": _float(0.1),
    "max_connections": _int(1),
    "strategy": lambda raw: Strategy(_choice(*Strategy)(raw)),
    "queue_writer": _bool,
    "writer_block_ms": lambda raw: _writer_block(_int(1)(raw)),
    "writer_claim_idle_s": _float(0.1),
    "stream_max": _int(1),
    "zookeeper_hosts": _addresses,
    "optimistic_attempts": _int(1),
    "optimistic_backoff_ms": _float(0.0),
    "optimistic_backoff_max_ms": _float(0.0),
    "user_rate": _rate,
    "client_rate": _rate,
    "waiting_page_return_origins": parse_origins,
}
