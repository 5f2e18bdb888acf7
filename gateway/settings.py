"""Settings: one frozen object, read from the environment and CLI flags.

This is the only module that reads ``os.environ``. Every setting is an
environment variable ``GATEWAY_<NAME>`` and a CLI flag ``--<name>``; the flag
wins. Each setting is one field of :class:`Settings`, declared with its
default and its parser (:func:`setting`); the parser reads the text once, into
the value the gateway uses, or raises ValueError with a short reason, which
:func:`load` turns into a :class:`SettingsError` naming the setting, printed by
the CLI as one line before it exits.

Every layer is handed this object; it imports only the domain.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from gateway.domain.model import Strategy
from gateway.domain.rules import Rate, parse_rate

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = tuple[str, int]
T = TypeVar("T")


class SettingsError(ValueError):
    """A setting has a value the gateway cannot run with."""


class Misconfigured(SettingsError):
    """A setting names a dependency the gateway cannot use; ``found`` says what is
    there ("not PostgreSQL", "nothing answers at host:port"). The message is the
    one line the CLI prints: the setting, its URL (password masked), the finding.

    ``final`` is False when what was found may be a server still starting
    (nothing answers yet): start-up waits for it, up to GATEWAY_STARTUP_WAIT_S.
    """

    def __init__(self, field: str, url: str, found: str, *, final: bool = True) -> None:
        self.setting, self.url, self.found, self.final = env_name(field), masked(url), found, final
        super().__init__(f"{self.setting}={self.url}: {found}")


# A password given as a query parameter (libpq's ?password=).
_QUERY_PASSWORD = re.compile(r"(^|&)(password=)[^&]*")


def masked(url: str) -> str:
    """``url`` with its password, in the authority or the query, shown as ``***``."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    netloc = f"{user}{colon and ':***'}{at}{hosts}"
    query = _QUERY_PASSWORD.sub(r"\1\2***", parts.query)
    if (netloc, query) == (parts.netloc, parts.query):
        return url  # urlunsplit would drop the empty authority of unix:///path
    return urlunsplit(parts._replace(netloc=netloc, query=query))


# How each setting is read from its text: one parser a field (given where the
# field is declared), each raising ValueError with a short reason.


def parse_networks(raw: str | None) -> tuple[Network, ...]:
    """``"10.0.0.0/8, 127.0.0.1"`` as networks; raises ValueError on a bad entry."""
    if not raw:
        return ()
    return tuple(ipaddress.ip_network(part.strip(), strict=False) for part in raw.split(","))


# The origins of GATEWAY_WAITING_PAGE_RETURN_ORIGINS; the waiting-room page
# checks a buyer's return_to with the same origin_of (gateway.http.waiting_page).
_DEFAULT_PORTS = {"http": 80, "https": 443}
# What a return_to may not contain: browsers read a backslash as a slash and
# drop whitespace and control characters, so the origin we check would not be
# the one they go to.
_UNSAFE = frozenset("\\ \t\r\n\x00")


def origin_of(url: str) -> str | None:
    """``scheme://host[:port]`` of an http(s) URL, lower case, default port left
    out; None for anything else (no host, credentials, unsafe characters)."""
    if any(c in _UNSAFE or ord(c) < 0x20 for c in url):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username is not None:
        return None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def parse_origins(raw: str) -> frozenset[str]:
    """A comma-separated list of origins (``https://shop.example``, no path);
    raises ValueError naming the first that is not one."""
    origins = set()
    for part in (p.strip() for p in raw.split(",")):
        origin = origin_of(part)
        if origin is None or urlsplit(part).path not in ("", "/") or "?" in part or "#" in part:
            raise ValueError(f"{part!r} is not an origin such as https://shop.example")
        origins.add(origin)
    return frozenset(origins)


def parse_image_origins(raw: str) -> frozenset[str]:
    """The origins of GATEWAY_WAITING_PAGE_IMAGE_ORIGINS, as :func:`parse_origins`
    reads them, each https, or http on a loopback host (a test's or a
    developer's server): a page served over https loads no http image (mixed
    content), and an image fetched in clear could be swapped on the way."""
    origins = parse_origins(raw)
    for origin in origins:
        host = urlsplit(origin).hostname or ""
        if origin.startswith("http:") and not is_loopback(host):
            raise ValueError(f"{origin!r}: an image origin must be https (http only on loopback)")
    return origins


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


def _addresses(raw: str) -> tuple[Address, ...]:
    pairs = []
    for part in raw.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError("must be host:port[,host:port...]")
        pairs.append((host, int(port)))
    return tuple(pairs)


def _zookeeper_hosts(raw: str) -> str:
    # kazoo takes the ensemble as its text; it is checked, not split.
    _addresses(raw)
    return raw


def _networks(raw: str) -> tuple[Network, ...]:
    try:
        return parse_networks(raw)
    except ValueError:
        raise ValueError("must be CIDRs or addresses, comma-separated") from None


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


def _webhook_url(raw: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL with a host")
    return raw


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine: localhost, 127.0.0.0/8 or ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _writer_block(raw: str) -> int:
    value = _int(1)(raw)
    # The Redis client's socket timeout is 5 s: a longer block would read as a timeout.
    if value > 4000:
        raise ValueError("must be <= 4000")
    return value


def _strategy(raw: str) -> Strategy:
    return Strategy(_choice(*Strategy)(raw))


class LockFamily(StrEnum):
    """Which distributed lock a sku's flush takes (``GATEWAY_FLUSH_LOCK``)."""

    REDIS = "redis"
    POSTGRES = "postgres"
    ZOOKEEPER = "zookeeper"
    NONE = "none"  # no lock: the database's guarded UPDATE alone


def _lock_family(raw: str) -> LockFamily:
    return LockFamily(_choice(*LockFamily)(raw))


# The key of a field's parser in its metadata.
PARSE = "parse"


def setting(default: T, parse: Callable[[str], T]) -> T:
    """A field of :class:`Settings`: its default, and how its text is read
    (``parse`` returns the value or raises ValueError with a short reason)."""
    return field(default=default, metadata={PARSE: parse})


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the gateway is configured by; passed in explicitly."""

    host: str = setting("127.0.0.1", _text)
    port: int = setting(8080, _int(0))
    redis_url: str = setting("redis://127.0.0.1:6379/0", _url("redis", "rediss", "unix"))
    # "host:port,host:port": connect to the primary that these Sentinels name.
    redis_sentinels: tuple[Address, ...] = setting((), _addresses)
    redis_sentinel_master: str = setting("flashsale", _text)
    # "host:port,host:port": seed nodes of a Redis Cluster (not with Sentinels).
    redis_cluster_nodes: tuple[Address, ...] = setting((), _addresses)
    database_url: str = setting(
        "postgresql://postgres@127.0.0.1:5432/flashsale", _url("postgres", "postgresql")
    )
    key_prefix: str = setting("fs", _text)
    admin_token: str | None = setting(None, _text)
    batch_max: int = setting(256, _int(1))
    # 0: natural batching, a flush takes whatever joined the backlog while the last one ran
    # (loadtests: the flush's wait holds every buyer of a closed loop, and no
    # open-loop rate measured gained from it; docs/performance.md).
    batch_wait_ms: float = setting(0.0, _float(0.0))
    reservation_timeout_s: float = setting(30.0, _float(0.1))
    flush_lock: LockFamily = setting(LockFamily.REDIS, _lock_family)
    lock_lease_s: float = setting(10.0, _float(0.05))
    # Purchases in flight per process (the batcher's backlog, and those of the
    # strategies that decide in PostgreSQL) past which new ones are shed with 503.
    backlog_max: int = setting(10_000, _int(1))
    redis_pool_size: int = setting(64, _int(1))
    db_pool_size: int = setting(8, _int(2))
    drain_s: float = setting(10.0, _float(0.0))
    # After SIGTERM, how long /readyz answers 503 while purchases are still
    # served, so a load balancer's checks take the instance out before the drain.
    lame_duck_s: float = setting(0.0, _float(0.0))
    # CIDRs whose X-Forwarded-For / Forwarded headers are believed (for the logs).
    trusted_proxies: tuple[Network, ...] = setting((), _networks)
    # How long start-up waits for Redis and PostgreSQL to answer before giving up:
    # within 10 s, every command names a misconfiguration (docs/settings.md).
    startup_wait_s: float = setting(10.0, _float(0.0))
    reconcile_interval_s: float = setting(5.0, _float(0.05))
    # A sku's Redis state expires this long after it was last written (a sold-out
    # sku's last write is its last settle); PostgreSQL answers, and refills it, after.
    sale_retention_s: float = setting(86_400.0, _float(1.0))
    # A release (released_reservations) is deleted this long after it was made:
    # it only stops a flush still on its way with the reservation it names, so
    # it must outlast the reservation timeout (gateway.postgres.retention).
    release_retention_s: float = setting(3_600.0, _float(1.0))
    # After Redis lost a sale, the most of the event loop's CPU time the
    # background rebuild of its hashes takes (gateway.usecases.rebuilds); 1: no pacing.
    rebuild_share: float = setting(0.1, _share)
    log_level: str = setting("info", _choice("debug", "info", "warning", "error"))
    metrics: bool = setting(True, _bool)
    # A loop stalled this long gets its stack logged while still stuck
    # (event_loop_stalled, gateway.ops.loop_lag); 0: never.
    loop_stall_report_s: float = setting(0.5, _float(0.0))
    # Worker processes sharing the port (SO_REUSEPORT), supervised by one parent.
    workers: int = setting(1, _int(1))
    # Set for workers by their supervisor (PROMETHEUS_MULTIPROC_DIR): where
    # prometheus-client keeps the values every worker's /metrics adds up.
    multiproc_dir: str | None = setting(None, _text)
    # Set for workers by their supervisor (gateway.write.lanes): the directory
    # of the host's lane sockets, this worker's index and the number of
    # workers; each sku is flushed by one of them, whichever worker reserved it.
    lanes_dir: str | None = setting(None, _text)
    lane_index: int = setting(0, _int(0))
    lane_count: int = setting(1, _int(1))
    # A file of admin bearer tokens, one a line (two during a rotation), read
    # again whenever its mtime, size or inode changes; with admin_token, both count.
    admin_token_file: str | None = setting(None, _file)
    # Waiting rooms: the key signing admission tokens, and the one before it,
    # still accepted (never used to sign) while a rotation is under way.
    admission_secret: str | None = setting(None, _secret)
    admission_secret_previous: str | None = setting(None, _secret)
    # The payment service's bearer token for POST /v1/orders/{id}/pay and
    # /cancel (not the admin token); without it no sku may have a payment window.
    payment_token: str | None = setting(None, _secret)
    # Longest the expiry sweep sleeps between two looks for due orders; it
    # wakes sooner for a deadline it knows of.
    expiry_sweep_s: float = setting(0.25, _float(0.01))
    # Hostile clients: a request's head and body must arrive within this long of
    # its first byte (and a new connection's first request within this long).
    request_read_timeout_s: float = setting(10.0, _float(0.1))
    # Open connections per gateway process; those beyond get a 503 and are closed.
    max_connections: int = setting(10_000, _int(1))
    # How purchases take their stock (gateway.domain.model.Strategy).
    strategy: Strategy = setting(Strategy.RESERVE_BATCH, _strategy)
    # Queue strategy: run a stream writer inside each gateway process too (the
    # CLI's ``writer`` command runs writers on their own).
    queue_writer: bool = setting(True, _bool)
    # Longest a writer's XREADGROUP waits for a first entry (below the socket timeout).
    writer_block_ms: int = setting(1000, _writer_block)
    # A stream entry delivered this long ago and not acknowledged belongs to a
    # writer presumed dead: another one claims it (XAUTOCLAIM).
    writer_claim_idle_s: float = setting(10.0, _float(0.1))
    # Entries a sku's stream holds at most (queued and in a writer's hands):
    # beyond it purchases are refused with 503 before anything is reserved.
    stream_max: int = setting(100_000, _int(1))
    # "host:port,host:port" of the ZooKeeper ensemble (GATEWAY_FLUSH_LOCK=zookeeper).
    zookeeper_hosts: str = setting("127.0.0.1:2181", _zookeeper_hosts)
    # The optimistic strategy's retry budget: attempts per purchase, and the
    # first and the largest pause between them (full jitter, doubling).
    optimistic_attempts: int = setting(8, _int(1))
    optimistic_backoff_ms: float = setting(2.0, _float(0.0))
    optimistic_backoff_max_ms: float = setting(50.0, _float(0.0))
    # Token buckets "N/s:burst" per user and per client address, per sku (a
    # sku's own rate wins); None: off.
    user_rate: Rate | None = setting(None, parse_rate)
    client_rate: Rate | None = setting(None, parse_rate)
    # Origins a waiting-room page may send an admitted buyer back to
    # (``return_to``) or to pay (``pay_to``), gateway.http.waiting_page; empty:
    # none, both are refused.
    waiting_page_return_origins: frozenset[str] = setting(frozenset(), parse_origins)
    # Order events POSTed to the shop, signed with the secret (docs/events.md);
    # unset: no webhook. Plain http is refused beyond loopback unless allowed:
    # the events carry buyers' ids and a man in the middle could read them.
    webhook_url: str | None = setting(None, _webhook_url)
    webhook_secret: str | None = setting(None, _secret)
    # One POST's whole time, connecting included; past it the event is retried.
    webhook_timeout_s: float = setting(5.0, _float(0.01))
    # How long an event may stay undelivered to the webhook before it is
    # dead-lettered (3 days, as Stripe retries).
    webhook_max_age_s: float = setting(259_200.0, _float(1.0))
    webhook_allow_http: bool = setting(False, _bool)
    # Order events published to this RabbitMQ's durable topic exchange, routing
    # key the event's type; unset: none.
    events_amqp_url: str | None = setting(None, _url("amqp", "amqps"))
    events_amqp_exchange: str = setting("flashsale.events", _text)
    # Origins a sku's image_url may be on (its display fields); the page's CSP
    # allows images from them alone. Empty: no sku may have an image.
    waiting_page_image_origins: frozenset[str] = setting(frozenset(), parse_image_origins)
    # The bot check at a waiting room's door (gateway.outbound.bot_check): the
    # provider's siteverify URL (Turnstile, hCaptcha, reCAPTCHA) and this
    # site's secret there; both or neither. Plain http only to loopback: the
    # secret travels in every POST.
    bot_check_url: str | None = setting(None, _webhook_url)
    bot_check_secret: str | None = setting(None, _text)
    # Order events (gateway.usecases.relay): run the relay in this process.
    events_relay: bool = setting(True, _bool)
    # A flush appends its new orders' first events to the stream itself, the
    # relay the fallback (gateway.usecases.handoff); with the relay, on one Redis.
    events_handoff: bool = setting(True, _bool)
    # The Redis Stream every event is appended to, and how it is trimmed: to
    # about this many entries when set, else to this many seconds of entries
    # (0: never); never past an event still owed to the webhook.
    events_stream: str = setting("flashsale:events", _text)
    events_stream_max_len: int = setting(0, _int(0))
    events_stream_max_age_s: float = setting(86_400.0, _float(0.0))
    # Replicas an append must reach (WAIT) before its events count as
    # delivered, so a failover cannot lose them; unset: 1 with Sentinels or a
    # Cluster, 0 on a single Redis (stream_replicas).
    events_stream_replicas: int | None = setting(None, _int(0))
    # A delivered event is pruned from the outbox this long after it occurred.
    events_retention_s: float = setting(604_800.0, _float(1.0))
    # Events a relay claims per sink and pass, and its pause when none is due.
    events_batch: int = setting(256, _int(1))
    events_poll_s: float = setting(0.1, _float(0.01))

    def __post_init__(self) -> None:
        if self.lane_index >= self.lane_count:
            raise SettingsError(
                f"{env_name('lane_index')}={self.lane_index}: must be below"
                f" {env_name('lane_count')}={self.lane_count}"
            )
        if self.release_retention_s < self.reservation_timeout_s:
            raise SettingsError(
                f"{env_name('release_retention_s')}={self.release_retention_s:g}: must be at"
                f" least {env_name('reservation_timeout_s')}={self.reservation_timeout_s:g}"
            )
        # A batch's reservations age while it waits; past the timeout the
        # reconciler gives them back and the flush finds them expired. Half
        # the timeout leaves the flush (its lock, its round trip) the rest.
        if self.batch_wait_ms >= self.reservation_timeout_s * 1000 / 2:
            raise SettingsError(
                f"{env_name('batch_wait_ms')}={self.batch_wait_ms:g}: must be below half of"
                f" {env_name('reservation_timeout_s')}={self.reservation_timeout_s:g}"
                " (in ms), or the reconciler gives back batches still waiting"
            )
        if self.redis_sentinels and self.redis_cluster_nodes:
            raise SettingsError(
                f"{env_name('redis_cluster_nodes')} and {env_name('redis_sentinels')}:"
                " set one of them, not both"
            )
        self._check_webhook()
        self._check_bot_check()

    @property
    def stream_replicas(self) -> int:
        """The replicas an event stream append waits for (events_stream_replicas)."""
        if self.events_stream_replicas is not None:
            return self.events_stream_replicas
        return 1 if self.redis_sentinels or self.redis_cluster_nodes else 0

    def _check_webhook(self) -> None:
        """A webhook needs its secret, and plain http only to loopback or when allowed."""
        if self.webhook_url is None:
            return
        named = f"{env_name('webhook_url')}={masked(self.webhook_url)}"
        if self.webhook_secret is None:
            raise SettingsError(f"{named}: needs {env_name('webhook_secret')} to sign events")
        parts = urlsplit(self.webhook_url)
        if parts.scheme == "http" and not (
            self.webhook_allow_http or is_loopback(parts.hostname or "")
        ):
            raise SettingsError(
                f"{named}: plain http to a host that is not loopback; use https,"
                f" or set {env_name('webhook_allow_http')}=true"
            )

    def _check_bot_check(self) -> None:
        """A bot check needs its URL and its secret, and plain http only to loopback."""
        url, secret = self.bot_check_url, self.bot_check_secret
        if url is None and secret is None:
            return
        if secret is None:
            raise SettingsError(f"{env_name('bot_check_url')} needs {env_name('bot_check_secret')}")
        if url is None:
            raise SettingsError(f"{env_name('bot_check_secret')} needs {env_name('bot_check_url')}")
        parts = urlsplit(url)
        if parts.scheme == "http" and not is_loopback(parts.hostname or ""):
            raise SettingsError(
                f"{env_name('bot_check_url')}={masked(url)}: plain http to a host that is not"
                " loopback would send the secret in clear; use https"
            )


# Settings whose variable is another library's, not ours.
_FOREIGN = {"multiproc_dir": "PROMETHEUS_MULTIPROC_DIR"}


# Settings renamed, still read under their former names (after the new one), so
# a deployment's environment and flags keep working: GATEWAY_QUEUE_MAX bounded
# the batcher's backlog before "queue" named the queue strategy alone.
_FORMER = {"backlog_max": "queue_max"}


def env_name(field: str) -> str:
    """The environment variable of a setting: ``batch_max`` -> ``GATEWAY_BATCH_MAX``."""
    return _FOREIGN.get(field, f"GATEWAY_{field.upper()}")


def _names(field: str) -> list[str]:
    """A setting's name, then its former one if it was renamed."""
    former = _FORMER.get(field)
    return [field] if former is None else [field, former]


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _shown(default: object) -> object:
    """A default as ``--help`` shows it: none, or an empty list, as ``unset``."""
    return "unset" if default is None or default in ((), frozenset()) else default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one ``--flag`` per setting to a CLI parser (values parsed later)."""
    for f in fields(Settings):
        parser.add_argument(
            *map(_flag, _names(f.name)),
            dest=f.name,
            default=None,
            metavar="VALUE",
            help=f"overrides {env_name(f.name)} (default: {_shown(f.default)})",
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
        raw, source = overrides.get(f.name), _flag(f.name)
        for name in _names(f.name):
            if raw is None:
                raw, source = environ.get(env_name(name)), env_name(name)
        if raw is None:
            continue
        try:
            values[f.name] = f.metadata[PARSE](raw)
        except ValueError as exc:
            raise SettingsError(f"{source}={raw!r}: {exc}") from None
    return Settings(**values)


def from_args(argv: Sequence[str] | None, parser: argparse.ArgumentParser) -> Settings:
    """Parse CLI flags with ``parser`` and merge them over the environment."""
    namespace = parser.parse_args(argv)
    return load(overrides={f.name: getattr(namespace, f.name, None) for f in fields(Settings)})


def worker_environment(
    multiproc_dir: str, lanes_dir: str, index: int, count: int
) -> dict[str, str]:
    """The environment of worker ``index`` of ``count``: ours, one worker, shared
    metric files, and the host's lanes (gateway.write.lanes)."""
    return {
        **os.environ,
        env_name("workers"): "1",
        env_name("multiproc_dir"): multiproc_dir,
        env_name("lanes_dir"): lanes_dir,
        env_name("lane_index"): str(index),
        env_name("lane_count"): str(count),
    }
