"""The shared Redis, PostgreSQL and RabbitMQ a test session runs against, and its databases.

The servers are the ones on 127.0.0.1 (``make test`` starts them if nothing
listens); ``TEST_REDIS_URL``, ``TEST_PG_ADMIN_URL`` and ``TEST_AMQP_URL`` point elsewhere.
Databases are created and dropped by name on the server of an admin URL.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import asyncpg

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
PG_ADMIN_URL = os.environ.get("TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def database_url(name: str, server_url: str = PG_ADMIN_URL) -> str:
    """The URL of database ``name`` on the server of ``server_url``."""
    return urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))


def quote_ident(name: str) -> str:
    """``name`` as a double-quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


async def execute(database_url: str, statement: str, *args: object) -> None:
    """Run one statement on its own connection, as an operator would by hand."""
    con = await asyncpg.connect(database_url)
    try:
        await con.execute(statement, *args)
    finally:
        await con.close()


async def create_database(name: str, server_url: str = PG_ADMIN_URL) -> str:
    """CREATE DATABASE ``name`` on the server of ``server_url``; returns its URL."""
    await execute(server_url, f"CREATE DATABASE {quote_ident(name)}")
    return database_url(name, server_url)


async def drop_database(name: str, server_url: str = PG_ADMIN_URL) -> None:
    """Drop database ``name`` if it exists, disconnecting whoever is still in it."""
    await execute(server_url, f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")
