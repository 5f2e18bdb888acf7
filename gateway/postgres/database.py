"""The PostgreSQL connection pool and the schema migrations in ``sql/``.

``sql/`` is installed as the package data ``gateway.sql`` (see pyproject.toml)
and read through :mod:`importlib.resources`, so a wheel migrates as a checkout does.

Migrations are the files ``sql/NNN_name.sql``, applied in order, each once,
inside one transaction with the version recorded in ``schema_migrations``.
Functions live in ``sql/functions/*.sql`` and are applied after them whenever
their text changed (recorded as ``functions/<name>@<sha256 prefix>``), so a
function is edited in place rather than copied into a new migration.
Several gateways may start at the same moment against one database, so the
whole step runs under a transaction-scoped advisory lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import socket
import struct
from collections.abc import AsyncIterator
from importlib import resources
from importlib.resources.abc import Traversable
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from gateway.domain.errors import PostgresUnavailable
from gateway.settings import LockFamily, Misconfigured, Settings

SQL_DIR: Traversable = resources.files("gateway.sql")
MIGRATION_NAME = re.compile(r"[0-9]{3}_.*\.sql")
FUNCTION_NAME = re.compile(r".*\.sql")

# Any fixed number: every gateway takes the same lock before migrating.
MIGRATION_LOCK_KEY = 0x666C617368  # "flash"

CREATE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     text PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""
TAKE_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock($1)"
APPLIED_VERSIONS = "SELECT version FROM schema_migrations"
RECORD_VERSION = "INSERT INTO schema_migrations (version) VALUES ($1)"

Pool = asyncpg.Pool
# What the driver raises when PostgreSQL cannot be reached or refuses: every
# adapter turns these into PostgresUnavailable (a 503).
DB_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # Raised by the driver when a broken connection is reused mid-protocol.
    asyncpg.InternalClientError,
    # asyncpg lets its socket's errors (refused, reset) escape bare. A buyer's
    # connection raises them too, but only where its body is read, which tells
    # it apart first (gateway.http.views.read_body: the outcome client_gone).
    OSError,
    TimeoutError,
)
# A connection of its own or one borrowed from a pool.
Connection = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy


def cause(exc: BaseException) -> str:
    """What a 503 says of the driver error behind it."""
    return f"postgres: {type(exc).__name__}"


class _AsUnavailable:
    """The translation every PostgreSQL adapter makes, in one place: a driver
    error (:data:`DB_ERRORS`) raised inside ``with as_unavailable:`` leaves it
    as :class:`PostgresUnavailable`; anything else passes through. One shared
    instance, so entering it allocates nothing on a purchase's path."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(exc, DB_ERRORS):
            raise PostgresUnavailable(cause(exc)) from exc


as_unavailable = _AsUnavailable()


def _sql_files(folder: Traversable, pattern: re.Pattern[str]) -> list[Traversable]:
    """The files of ``folder`` whose whole name matches ``pattern``, sorted by name."""
    found = [f for f in folder.iterdir() if f.is_file() and pattern.fullmatch(f.name)]
    return sorted(found, key=lambda f: f.name)


def migration_versions(sql_dir: Traversable = SQL_DIR) -> list[tuple[str, str]]:
    """``(version, sql)`` of every migration, then of every function, in order."""
    found = [
        (path.name.removesuffix(".sql"), path.read_text())
        for path in _sql_files(sql_dir, MIGRATION_NAME)
    ]
    for path in _sql_files(sql_dir / "functions", FUNCTION_NAME):
        text = path.read_text()
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        found.append((f"functions/{path.name.removesuffix('.sql')}@{digest}", text))
    return found


async def migrate(con: Connection, sql_dir: Traversable = SQL_DIR) -> list[str]:
    """Apply every migration and function version not yet recorded; the ones applied now."""
    applied_now: list[str] = []
    async with con.transaction():
        await con.execute(TAKE_MIGRATION_LOCK, MIGRATION_LOCK_KEY)
        await con.execute(CREATE_MIGRATIONS_TABLE)
        done = {r["version"] for r in await con.fetch(APPLIED_VERSIONS)}
        for version, text in migration_versions(sql_dir):
            if version in done:
                continue
            await con.execute(text)
            await con.execute(RECORD_VERSION, version)
            applied_now.append(version)
    return applied_now


async def ensure_database(database_url: str) -> bool:
    """Create the database named in ``database_url`` if it does not exist.

    Connects to the server's ``postgres`` database to do so. Returns whether it
    created one; raises :class:`Misconfigured` as :func:`connect` does.
    """
    parts = urlsplit(database_url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    try:
        con = await connect(admin)
    except Misconfigured as exc:  # named as set, not as the admin URL made from it
        raise Misconfigured("database_url", database_url, exc.found, final=exc.final) from exc
    try:
        exists = await con.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if exists:
            return False
        quoted = '"' + name.replace('"', '""') + '"'
        await con.execute(f"CREATE DATABASE {quoted}")
        return True
    finally:
        await con.close()


async def create_pool(settings: Settings) -> Pool:
    """A bounded pool: requests beyond its size queue for a connection.

    The gateway's statements leave no session state behind them (no SET, LISTEN,
    cursor or session advisory lock), so a connection goes back to the pool
    without asyncpg's reset query, a round trip on every use that the flush
    waited for (docs/performance.md, "pool without the reset query").
    An open transaction is still rolled back (asyncpg does that whatever the
    reset). The PostgreSQL flush lock is the exception: it holds session advisory
    locks on pool connections and relies on the reset's
    ``pg_advisory_unlock_all()`` when a hold is lost, so with it the reset stays.
    Raises :class:`Misconfigured` as :func:`connect` does.
    """
    async with _diagnosing(settings.database_url):
        pool = await asyncpg.create_pool(
            settings.database_url,
            min_size=2,
            max_size=settings.db_pool_size,
            command_timeout=10,
            timeout=CONNECT_TIMEOUT_S,
            reset=None if settings.flush_lock is LockFamily.POSTGRES else _stateless,
        )
    assert pool is not None
    return pool


async def _stateless(con: asyncpg.Connection) -> None:
    """The pool's reset when no session state is left: nothing to send."""


# How long a connection may take to open, start-up exchange included: a URL that
# points at something other than PostgreSQL (a Redis) never finishes it.
CONNECT_TIMEOUT_S = 5.0
# How long the probe behind a failed connection waits for each step.
PROBE_TIMEOUT_S = 1.0
# PostgreSQL's SSLRequest: its server answers with the single byte S or N at once,
# before any authentication, so the answer tells PostgreSQL from anything else.
SSL_REQUEST = struct.pack("!ii", 8, 80877103)
DEFAULT_PORT = 5432


async def connect(url: str) -> asyncpg.Connection:
    """A connection of its own to ``url``, within :data:`CONNECT_TIMEOUT_S`.

    Raises :class:`Misconfigured` naming GATEWAY_DATABASE_URL and what is there
    when it cannot be made: not final (``final=False``) when nothing answers
    yet, or the server is starting, as a server still starting up shows.
    """
    async with _diagnosing(url):
        return await asyncpg.connect(url, timeout=CONNECT_TIMEOUT_S)


@contextlib.asynccontextmanager
async def _diagnosing(url: str) -> AsyncIterator[None]:
    """Turn a failure to connect to ``url`` into :class:`Misconfigured`."""
    try:
        yield
    except (
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        # What the driver raises on bytes that are not PostgreSQL's protocol.
        asyncpg.InternalClientError,
        OSError,
        TimeoutError,
    ) as exc:
        raise await _diagnosis(url, exc) from exc


async def _diagnosis(url: str, exc: BaseException) -> Misconfigured:
    """What a failed connection to ``url`` found there: the server's own refusal
    when it answered, else what a probe of its address finds."""
    if isinstance(exc, asyncpg.PostgresError):
        return _refusal(url, exc)
    parts = urlsplit(url)
    try:
        host, port = parts.hostname, parts.port or DEFAULT_PORT
    except ValueError:  # several hosts: asyncpg tries each, the probe cannot say which
        host = None
    if isinstance(exc, socket.gaierror):
        return Misconfigured(
            "database_url", url, f"host {host} not found ({exc.strerror})", final=False
        )
    if host is None:  # a Unix socket, or several hosts
        return Misconfigured("database_url", url, _one_line(exc), final=False)
    answer = await _probe(host, port)
    if answer is None:
        return Misconfigured("database_url", url, f"nothing answers at {host}:{port}", final=False)
    if answer not in (b"S", b"N"):
        found = f"not PostgreSQL (no answer to its greeting at {host}:{port})"
        return Misconfigured("database_url", url, found)
    found = f"PostgreSQL did not let us in ({_one_line(exc)})"
    return Misconfigured("database_url", url, found, final=False)


def _refusal(url: str, exc: asyncpg.PostgresError) -> Misconfigured:
    """What the PostgreSQL at ``url`` said when it refused the connection."""
    parts = urlsplit(url)
    if isinstance(
        exc, asyncpg.InvalidAuthorizationSpecificationError | asyncpg.InvalidPasswordError
    ):
        found = f"authentication failed for role {parts.username} ({_one_line(exc)})"
    elif isinstance(exc, asyncpg.InvalidCatalogNameError):
        found = f"database {parts.path.lstrip('/')} does not exist"
    elif isinstance(exc, asyncpg.CannotConnectNowError | asyncpg.TooManyConnectionsError):
        found = f"PostgreSQL refuses connections for now ({_one_line(exc)})"
        return Misconfigured("database_url", url, found, final=False)
    else:
        found = f"PostgreSQL refused the connection ({_one_line(exc)})"
    return Misconfigured("database_url", url, found)


async def _probe(host: str, port: int) -> bytes | None:
    """What ``host:port`` answers to an SSLRequest (empty: nothing in time), or
    None when no connection opens."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(SSL_REQUEST)
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            return await reader.read(1)
    except (OSError, TimeoutError):
        return b""
    finally:
        writer.transport.abort()


def _one_line(exc: BaseException) -> str:
    """The driver's message on one line (its class when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__
