"""Fixtures of the chaos suite: private servers per test, and logs on failure.

Every server fixture tears down in ``finally`` (the ``async with`` of each
server). They are function-scoped, so no test inherits another's broken server,
except ``shared_pg``: one PostgreSQL cluster per scenario module, restarted by
``pg`` if a scenario left it down (each scenario uses a new database on it).
``diagnostics`` collects callables whose text is attached to the report of a
failed test (gateway, Redis, Sentinel and PostgreSQL log tails), read before
the fixtures remove their directories.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator

import pytest
import pytest_asyncio

from testkit.postgres_servers import PostgresCluster
from testkit.redis_servers import RedisServer
from testkit.sentinels import RedisSentinelCluster
from tests.chaos.reporting import CHAOS_PROPERTY, REPORT_LINES, Diagnostics


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach every registered diagnostic to the report of a failed test, and the
    scenario lines the test wrote to its report (so the terminal summary, printed
    by the process that collects the reports, sees them under pytest-xdist too)."""
    report = yield
    if report.when == "call":
        report.user_properties += [(CHAOS_PROPERTY, line) for line in REPORT_LINES]
        REPORT_LINES.clear()
    if report.failed and report.when in ("setup", "call"):
        for source in getattr(item, "chaos_diagnostics", []):
            try:
                text = source()
            except Exception as exc:  # a broken log reader must not hide the failure
                text = f"(diagnostic failed: {exc!r})"
            report.sections.append(("chaos diagnostics", text))
    return report


@pytest.fixture
def diagnostics(request: pytest.FixtureRequest) -> Diagnostics:
    """Append ``() -> str`` callables; their text is shown if the test fails."""
    sources: Diagnostics = []
    request.node.chaos_diagnostics = sources
    return sources


@pytest.fixture
async def redis_server(diagnostics: Diagnostics) -> AsyncIterator[RedisServer]:
    """A private, empty redis-server on a free port."""
    async with RedisServer() as server:
        diagnostics.append(lambda: f"--- redis {server.port}\n{server.log_tail()}")
        yield server


@pytest.fixture
async def pg_cluster(diagnostics: Diagnostics) -> AsyncIterator[PostgresCluster]:
    """A private PostgreSQL cluster on a free port."""
    async with PostgresCluster() as cluster:
        diagnostics.append(lambda: f"--- postgres {cluster.port}\n{cluster.log_tail()}")
        yield cluster


@pytest.fixture
async def sentinel_cluster(diagnostics: Diagnostics) -> AsyncIterator[RedisSentinelCluster]:
    """A primary, a replica and three Sentinels that already know each other."""
    async with RedisSentinelCluster() as cluster:
        diagnostics.append(cluster.log_tails)
        yield cluster


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_pg() -> AsyncIterator[PostgresCluster]:
    """One private PostgreSQL cluster per test module; each scenario gets a new database."""
    async with PostgresCluster() as cluster:
        yield cluster


@pytest.fixture
async def pg(shared_pg: PostgresCluster, diagnostics: Diagnostics) -> PostgresCluster:
    """The module's cluster, running (a failed scenario may have left it down)."""
    diagnostics.append(lambda: f"--- postgres {shared_pg.port}\n{shared_pg.log_tail()}")
    if not shared_pg.running:
        await shared_pg.start()
    return shared_pg
