"""Settings: one frozen object, read from the environment and CLI flags.

This is the only module that reads ``os.environ``. Every setting is an
environment variable ``GATEWAY_<NAME>`` and a CLI flag ``--<name>``; the flag
wins; each value is parsed by :mod:`gateway.settingparsers`. A bad value raises
:class:`SettingsError` naming the setting, which the CLI prints as one line
before it exits.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from gateway.domain.model import Strategy
from gateway.domain.rules import Rate, parse_rate
from gateway.settingparsers import PARSERS


class SettingsError(ValueError):
    """A setting has a value the gateway cannot run with."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the gateway is configured by; passed in explicitly."""

    host: str = "127.0.0.1"
    port: int = 8080
    redis_url: str = "redis://127.0.0.1:6379/0"
    # "host:port,host:port": connect to the primary that these Sentinels name.
    redis_sentinels: str | None = None
    redis_sentinel_master: str = "flashsale"
    # "host:port,host:port": seed nodes of a Redis Cluster (not with Sentinels).
    redis_cluster_nodes: str | None = None
    database_url: str = "postgresql://postgres@127.0.0.1:5432/flashsale"
    key_prefix: str = "fs"
    admin_token: str | None = None
    batch_max: int = 256
    # 0: natural batching, a flush takes whatever queued while the last one ran
    # (loadtests: the flush's wait holds every buyer of a closed loop, and no
    # open-loop rate measured gained from it; docs/performance.md).
    batch_wait_ms: float = 0.0
    reservation_timeout_s: float = 30.0
    flush_lock: str = "redis"
    lock_lease_s: float = 10.0
    queue_max: int = 10_000
    redis_pool_size: int = 64
    db_pool_size: int = 8
    drain_s: float = 10.0
    # After SIGTERM, how long /readyz answers 503 while purchases are still
    # served, so a load balancer's checks take the instance out before the drain.
    lame_duck_s: float = 0.0
    # CIDRs whose X-Forwarded-For / Forwarded headers are believed (for the logs).
    trusted_proxies: str | None = None
    # How long start-up waits for Redis and PostgreSQL to answer before giving up.
    startup_wait_s: float = 30.0
    reconcile_interval_s: float = 5.0
    # A sku's Redis state expires this long after it was last written (a sold-out
    # sku's last write is its last settle); PostgreSQL answers, and refills it, after.
    sale_retention_s: float = 86_400.0
    # After Redis lost a sale, the most of the event loop's CPU time the
    # background rebuild of its hashes takes (gateway.usecases.rebuilds); 1: no pacing.
    rebuild_share: float = 0.1
    log_level: str = "info"
    metrics: bool = True
    # A loop stalled this long gets its stack logged while still stuck
    # (event_loop_stalled, gateway.ops.loop_lag); 0: never.
    loop_stall_report_s: float = 0.5
    # Worker processes sharing the port (SO_REUSEPORT), supervised by one parent.
    workers: int = 1
    # Set for workers by their supervisor (PROMETHEUS_MULTIPROC_DIR): where
    # prometheus-client keeps the values every worker's /metrics adds up.
    multiproc_dir: str | None = None
    # A file of admin bearer tokens, one a line (two during a rotation), read
    # again whenever its mtime, size or inode changes; with admin_token, both count.
    admin_token_file: str | None = None
    # Waiting rooms: the key signing admission tokens, and the one before it,
    # still accepted (never used to sign) while a rotation is under way.
    admission_secret: str | None = None
    admission_secret_previous: str | None = None
    # Hostile clients: a request's head and body must arrive within this long of
    # its first byte (and a new connection's first request within this long).
    request_read_timeout_s: float = 10.0
    # Open connections per gateway process; those beyond get a 503 and are closed.
    max_connections: int = 10_000
    # How purchases take their stock (gateway.domain.model.Strategy).
    strategy: Strategy = Strategy.RESERVE_BATCH
    # Queue strategy: run a stream writer inside each gateway process too (the
    # CLI's ``writer`` command runs writers on their own).
    queue_writer: bool = True
    # Longest a writer's XREADGROUP waits for a first entry (below the socket timeout).
    writer_block_ms: int = 1000
    # A stream entry delivered this long ago and not acknowledged belongs to a
    # writer presumed dead: another one claims it (XAUTOCLAIM).
    writer_claim_idle_s: float = 10.0
    # Entries a sku's stream holds at most (queued and in a writer's hands):
    # beyond it purchases are refused with 503 before anything is reserved.
    stream_max: int = 100_000
    # "host:port,host:port" of the ZooKeeper ensemble (GATEWAY_FLUSH_LOCK=zookeeper).
    zookeeper_hosts: str = "127.0.0.1:2181"
    # The optimistic strategy's retry budget: attempts per purchase, and the
    # first and the largest pause between them (full jitter, doubling).
    optimistic_attempts: int = 8
    optimistic_backoff_ms: float = 2.0
    optimistic_backoff_max_ms: float = 50.0
    # Token buckets "N/s:burst" per user and per client address, per sku (a
    # sku's own rate wins); None: off.
    user_rate: str | None = None
    client_rate: str | None = None
    # Origins a waiting-room page may send an admitted buyer back to
    # (``return_to``, gateway.http.waiting_page); empty: none, return_to is refused.
    waiting_page_return_origins: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.redis_sentinels and self.redis_cluster_nodes:
            raise SettingsError(
                f"{env_name('redis_cluster_nodes')} and {env_name('redis_sentinels')}:"
                " set one of them, not both"
            )

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """The Sentinels as (host, port) pairs; empty when not using Sentinel."""
        return _pairs(self.redis_sentinels)

    @property
    def user_rate_limit(self) -> Rate | None:
        """The default per-user rate of a sku, None when off."""
        return None if self.user_rate is None else parse_rate(self.user_rate)

    @property
    def client_rate_limit(self) -> Rate | None:
        """The default per-client-address rate of a sku, None when off."""
        return None if self.client_rate is None else parse_rate(self.client_rate)

    @property
    def cluster_addresses(self) -> list[tuple[str, int]]:
        """The Redis Cluster seed nodes as (host, port) pairs; empty without a cluster."""
        return _pairs(self.redis_cluster_nodes)


def _pairs(addresses: str | None) -> list[tuple[str, int]]:
    """``host:port,...`` as (host, port) pairs; empty for None."""
    if not addresses:
        return []
    pairs = (part.strip().rpartition(":") for part in addresses.split(","))
    return [(host, int(port)) for host, _, port in pairs]


# Settings whose variable is another library's, not ours.
_FOREIGN = {"multiproc_dir": "PROMETHEUS_MULTIPROC_DIR"}


def env_name(field: str) -> str:
    """The environment variable of a setting: ``batch_max`` -> ``GATEWAY_BATCH_MAX``."""
    return _FOREIGN.get(field, f"GATEWAY_{field.upper()}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one ``--flag`` per setting to a CLI parser (values parsed later)."""
    for f in fields(Settings):
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f.name,
            default=None,
            metavar="VALUE",
            help=f"overrides {env_name(f.name)} (default: {f.default})",
        )


def load(
    environ: Mapping[str, str] | None = None, overrides: Mapping[str, str | None] | None = None
) -> Settings:
    """Build :class:`Settings` from environment variables and CLI overrides.

    Raises :class:`SettingsError` with a one-line message naming the setting.
    """
    environ = os.environ if environ is None else environ
    overrides = overrides or {}
    values: dict[str, Any] = {}
    for f in fields(Settings):
        raw = overrides.get(f.name)
        source = f"--{f.name.replace('_', '-')}"
        if raw is None:
            raw = environ.get(env_name(f.name))
            source = env_name(f.name)
        if raw is None:
            continue
        try:
            values[f.name] = PARSERS[f.name](raw)
        except ValueError as exc:
            raise SettingsError(f"{source}={raw!r}: {exc}") from None
    return Settings(**values)


def from_args(argv: Sequence[str] | None, parser: argparse.ArgumentParser) -> Settings:
    """Parse CLI flags with ``parser`` and merge them over the environment."""
    namespace = parser.parse_args(argv)
    return load(overrides={f.name: getattr(namespace, f.name, None) for f in fields(Settings)})


def worker_environment(multiproc_dir: str) -> dict[str, str]:
    """The environment of a worker process: ours, one worker, shared metric files."""
    return {**os.environ, env_name("workers"): "1", env_name("multiproc_dir"): multiproc_dir}
