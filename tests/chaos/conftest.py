"""Fixtures of the chaos suite: private servers per test, and logs on failure.

Every server fixture is function-scoped and tears down in ``finally`` (the
``async with`` of each server), so no test inherits another's broken server.
``diagnostics`` collects callables whose text is attached to the report of a
failed test (gateway, Redis, Sentinel and PostgreSQL log tails), read before
the fixtures remove their directories.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Generator

import pytest

from tests.chaos.servers import PostgresCluster, RedisSentinelCluster, RedisServer

Diagnostics = list[Callable[[], str]]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach every registered diagnostic to the report of a failed test."""
    report = yield
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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per chaos scenario that finished (collected by tests/chaos/scenarios.py)."""
    scenarios = sys.modules.get("tests.chaos.scenarios")
    lines: list[str] = getattr(scenarios, "REPORT_LINES", [])
    if lines:
        terminalreporter.section("chaos scenarios")
        for line in lines:
            terminalreporter.write_line(line)
