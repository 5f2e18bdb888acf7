"""A database as an earlier release left it, for tests of a migration on data
written before it."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg

from gateway.postgres.database import SQL_DIR, migrate
from testkit.services import create_database, drop_database

# A function's line naming the first migration whose schema it reads.
NEEDS = re.compile(r"^-- Needs migration ([0-9]{3})\b", re.MULTILINE)


def sql_before(version: str, folder: Path) -> Path:
    """A copy in ``folder`` of ``sql/``'s migrations before ``version`` (``"013"``)
    and of its functions but those that need a migration from ``version`` on
    (a ``-- Needs migration NNN`` line: an earlier release had no such
    function); returns the copy's path."""
    copy = folder / "sql"
    (copy / "functions").mkdir(parents=True)
    for path in SQL_DIR.iterdir():
        if path.is_file() and path.name.endswith(".sql") and path.name < version:
            (copy / path.name).write_text(path.read_text())
    for path in (SQL_DIR / "functions").iterdir():
        text = path.read_text()
        if all(needed < version for needed in NEEDS.findall(text)):
            (copy / "functions" / path.name).write_text(text)
    return copy


@asynccontextmanager
async def migrated_before(version: str, folder: Path) -> AsyncIterator[asyncpg.Connection]:
    """A connection to a new database migrated up to ``version`` (excluded),
    dropped afterwards; ``migrate(con)`` then applies the rest."""
    name = f"flashsale_upgrade_{uuid.uuid4().hex[:8]}"
    con = await asyncpg.connect(await create_database(name))
    try:
        await migrate(con, sql_before(version, folder))
        yield con
    finally:
        await con.close()
        await drop_database(name)
