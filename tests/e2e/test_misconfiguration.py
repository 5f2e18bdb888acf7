"""A setting that names the wrong thing: every command says so in one line and exits 2.

Each case runs the real CLI (``python -m gateway <command>``) with one bad URL
and the rest of the configuration good. The cross-wired cases point a URL at
the real Redis and PostgreSQL of the test session; "nothing answers" uses a
port nothing listens on. Each run is bounded by a timeout, so a hang fails the
test rather than holding the suite.

The runs are made together, a few at a time, before the first case is checked
(:func:`runs`), and each case's test checks its own: most of a run is waiting
(PostgreSQL's connect timeout of 5 s against a Redis, the 1 s start-up wait of
serve and writer), and one after another they took a minute.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from gateway.postgres.database import connect, migrate
from testkit.gateways import REPO, gateway_env
from testkit.ports import free_port
from testkit.services import REDIS_URL

# Far beyond what any case takes: reaching it means the command hung.
RUN_BOUND_S = 60
# CLI runs at once: enough to overlap their waits, few enough for two cores.
AT_ONCE = 4
PASSWORD = "s3cret-pw"
PG_PORT, REDIS_PORT = 5432, 6379
NO_HOST = "no-such-host.invalid"
ALL = ("migrate", "audit", "serve", "writer")
# The commands that read Redis (migrate only creates and migrates the database).
WITH_REDIS = ("audit", "serve", "writer")


@dataclass(frozen=True)
class Case:
    """One bad setting: which, its value (``{db}``: the session database's name,
    ``{port}``: a free port), and what the line must say was found there."""

    setting: str
    url: str
    found: str
    # Whether it may be a server still starting, which serve and writer wait for.
    waits: bool = False


CASES = {
    "postgres-url-at-redis": Case(
        "GATEWAY_DATABASE_URL",
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:{REDIS_PORT}/{{db}}",
        "not PostgreSQL",
    ),
    "unknown-role": Case(
        "GATEWAY_DATABASE_URL",
        f"postgresql://no_such_role:{PASSWORD}@127.0.0.1:{PG_PORT}/{{db}}",
        "authentication failed for role no_such_role",
    ),
    "missing-database": Case(
        "GATEWAY_DATABASE_URL",
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:{PG_PORT}/{{db}}_missing",
        "database {db}_missing does not exist",
    ),
    "postgres-refused": Case(
        "GATEWAY_DATABASE_URL",
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:{{port}}/{{db}}",
        "nothing answers at 127.0.0.1:{port}",
        waits=True,
    ),
    "postgres-dns": Case(
        "GATEWAY_DATABASE_URL",
        f"postgresql://postgres:{PASSWORD}@{NO_HOST}:{PG_PORT}/{{db}}",
        f"host {NO_HOST} not found",
        waits=True,
    ),
    "redis-db-out-of-range": Case(
        "GATEWAY_REDIS_URL", f"redis://127.0.0.1:{REDIS_PORT}/99", "database 99 does not exist"
    ),
    "redis-url-at-postgres": Case(
        "GATEWAY_REDIS_URL", f"redis://:{PASSWORD}@127.0.0.1:{PG_PORT}/0", "not Redis"
    ),
    # TLS asked of a Redis without it (issue 40.9): said so, not a timeout.
    "rediss-at-plain-redis": Case(
        "GATEWAY_REDIS_URL",
        f"rediss://127.0.0.1:{REDIS_PORT}/0",
        f"TLS refused: 127.0.0.1:{REDIS_PORT} is a Redis without TLS",
    ),
    "redis-refused": Case(
        "GATEWAY_REDIS_URL",
        f"redis://:{PASSWORD}@127.0.0.1:{{port}}/0",
        "nothing answers at 127.0.0.1:{port}",
        waits=True,
    ),
    "redis-dns": Case(
        "GATEWAY_REDIS_URL",
        f"redis://{NO_HOST}:{REDIS_PORT}/0",
        f"host {NO_HOST} not found",
        waits=True,
    ),
}


def _runs() -> list[tuple[str, str]]:
    """(case, command) of every command the case's setting matters to; migrate
    creates a missing database, so that one is not a misconfiguration to it."""
    runs = []
    for name, case in CASES.items():
        commands = WITH_REDIS if case.setting == "GATEWAY_REDIS_URL" else ALL
        runs += [(name, c) for c in commands if (name, c) != ("missing-database", "migrate")]
    return runs


@pytest.fixture(scope="module")
def migrated(database_url: str) -> str:
    """The session database, migrated, so audit gets as far as its books, with
    a sku that keeps Redis state, so audit needs Redis whatever else the
    session created (a Redis that answers nothing is no finding to the audit
    of skus that keep none there)."""

    async def up() -> None:
        con = await connect(database_url)
        try:
            await migrate(con)
            await con.execute(
                "INSERT INTO inventory (sku, stock, strategy) VALUES ($1, 0, 'reserve-batch')"
                " ON CONFLICT (sku) DO NOTHING",
                "misconfiguration-probe",
            )
        finally:
            await con.close()

    asyncio.run(up())
    return database_url


def masked(url: str) -> str:
    return url.replace(PASSWORD, "***")


def run_cli(command: str, settings: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The CLI's run with ``settings``; fails the test if it has not ended in time."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", command],
        cwd=REPO,
        env=gateway_env(settings),
        capture_output=True,
        text=True,
        timeout=RUN_BOUND_S,
        stdin=subprocess.DEVNULL,
    )


def log_events(lines: list[str]) -> list[dict[str, str]]:
    """The JSON log lines among ``lines`` (serve and writer log to stderr)."""
    return [json.loads(line) for line in lines if line.startswith("{")]


@dataclass(frozen=True)
class Run:
    """One case's run of one command: the bad URL given, the free port it may
    name, and the run (its result raises what running it raised)."""

    url: str
    port: int
    done: Future[subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def runs(migrated: str, run_id: str) -> Iterator[dict[tuple[str, str], Run]]:
    """Every case's runs, started together (:data:`AT_ONCE` at a time), by
    (case, command); each with a key prefix of its own."""
    db = migrated.rsplit("/", 1)[1]
    with ThreadPoolExecutor(AT_ONCE) as pool:
        made = {}
        for case, command in _runs():
            bad, port = CASES[case], free_port()
            url = bad.url.format(db=db, port=port)
            settings = {
                "GATEWAY_DATABASE_URL": migrated,
                "GATEWAY_REDIS_URL": REDIS_URL,
                "GATEWAY_KEY_PREFIX": f"t{run_id}{uuid.uuid4().hex[:6]}",
                "GATEWAY_PORT": str(free_port()),
                "GATEWAY_STARTUP_WAIT_S": "1",
                bad.setting: url,
            }
            made[case, command] = Run(url, port, pool.submit(run_cli, command, settings))
        yield made


@pytest.mark.parametrize(("case", "command"), _runs(), ids=[f"{c}-{m}" for c, m in _runs()])
def test_one_line_names_setting_url_and_finding(
    migrated: str, runs: dict[tuple[str, str], Run], case: str, command: str
) -> None:
    """The command ends with status 2 and, on stderr, no traceback and one line:
    the setting, its URL with the password masked, and what was found there.
    Serve and writer wait briefly (GATEWAY_STARTUP_WAIT_S=1) when nothing
    answers, and each line they log meanwhile names the setting and URL too;
    for anything else they do not wait, and the line is all they print."""
    bad, run = CASES[case], runs[case, command]
    db, port, url = migrated.rsplit("/", 1)[1], run.port, run.url
    done = run.done.result()
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and PASSWORD not in done.stderr, done.stderr
    plain = [line for line in lines if not line.startswith("{")]
    assert len(plain) == 1, done.stderr
    assert plain[0].startswith(f"flashsale-gateway {command}: {bad.setting}={masked(url)}: ")
    assert bad.found.format(db=db, port=port) in plain[0]
    events = log_events(lines)
    if not (bad.waits and command in ("serve", "writer")):
        assert events == [], done.stderr
        return
    assert events, done.stderr
    for event in events:
        assert event["event"] == "waiting_for_dependency", event
        assert (event["setting"], event["url"]) == (bad.setting, masked(url))


def test_good_urls_pass(migrated: str, key_prefix: str) -> None:
    """With both URLs right, audit reaches both stores and exits 0 with
    nothing on stderr: the checks reject no good configuration."""
    settings = {
        "GATEWAY_DATABASE_URL": migrated,
        "GATEWAY_REDIS_URL": REDIS_URL,
        "GATEWAY_KEY_PREFIX": key_prefix,
    }
    done = run_cli("audit", settings)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
