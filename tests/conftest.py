"""Session fixtures: a private PostgreSQL database and Redis key prefix per run.

Redis and PostgreSQL are the shared servers on 127.0.0.1 (``make test`` starts
them if nothing listens). Each test session works in its own database and
under its own key prefix, and removes both when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web_runner import BaseRunner
from redis.asyncio import Redis

from gateway.app import create_app
from gateway.http import fastpath
from gateway.settings import Settings, load
from testkit.purchases import ADMIN_TOKEN
from testkit.services import REDIS_URL, create_database, drop_database
from tests import summary
from tests.chaos.reporting import CHAOS_PROPERTY

# The chaos scenarios' lines, as their reports arrive (from xdist workers too).
_CHAOS_LINES: list[str] = []


# The lines tests added to the summary (tests.summary), by section.
_SUMMARY: dict[str, list[str]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the chaos scenario lines, the summary lines and the leftovers a test's
    report carries (a test's teardown report carries every property it added)."""
    _CHAOS_LINES.extend(str(v) for k, v in report.user_properties if k == CHAOS_PROPERTY)
    if report.when == "teardown":
        _LEFTOVERS.extend(
            f"{report.nodeid}: {v}" for k, v in report.user_properties if k == LEFTOVER_PROPERTY
        )
        for k, v in report.user_properties:
            section = summary.section_of(k)
            if section is not None:
                _SUMMARY.setdefault(section, []).append(str(v))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per chaos scenario that finished (tests.chaos.reporting), the lines
    tests added (tests.summary), and one per connection the collector closed
    after a test."""
    if _CHAOS_LINES:
        terminalreporter.section("chaos scenarios")
        for line in _CHAOS_LINES:
            terminalreporter.write_line(line)
    for section, lines in _SUMMARY.items():
        terminalreporter.section(section)
        for line in lines:
            terminalreporter.write_line(line)
    if _LEFTOVERS:
        terminalreporter.section(LEFTOVER_PROPERTY)
        for line in _LEFTOVERS:
            terminalreporter.write_line(line)


def _open_fds() -> set[tuple[str, str]]:
    """This process's open descriptors, each with what it is open on (a socket's
    inode): a test that closed one and leaked another leaves as many as it found."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:  # closed since the listing (the listing's own descriptor)
            continue
    return found


# A test's report carries what the collector closed after it, so the controller
# prints it (under pytest-xdist the test ran in a worker).
LEFTOVER_PROPERTY = "left to the garbage collector"
_LEFTOVERS: list[str] = []


@pytest.fixture(autouse=True)
async def _collect_leftovers_on_the_tests_loop(
    request: pytest.FixtureRequest,
) -> AsyncIterator[None]:
    """Collect the garbage a test left while its event loop still runs, and name the test.

    A library sometimes leaves a connection in a reference cycle (redis-py's
    cluster client drops a failed-over node's connections that way). In the
    gateway the collector closes it on the one loop, silently. Under pytest every
    test has its own loop: collected after that loop closed, the connection warns
    "unclosed socket" and "loop is closed" in whichever later test the collector
    happens to run in, and that test fails for another file's leftovers (CI saw a
    rebuild test fail on five connections to another test's Redis). So when a
    test leaves a descriptor open that was not open before (compared by what
    each is open on: a test that leaks one and closes another leaves the count
    even), collect at once, on its loop, and list what was closed under its
    name at the end of the run. Leaks the collector cannot reach are counted by
    tests/integration/test_connection_leaks.py."""
    before = _open_fds()
    yield
    _collect_leftovers(request.node, before)


# What was open when each test's setup began (pytest_runtest_setup).
_FDS_AT_SETUP = pytest.StashKey[set[tuple[str, str]]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_FDS_AT_SETUP] = _open_fds()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """The second net: collect what a test left once its fixtures and its loop
    are gone, before pytest looks for unraisable exceptions, and name the test.

    A connection a test's task still held when the fixture above looked is
    freed only when the loop is closed and its tasks are dropped; left to a
    later test's collection, it failed that test (a cluster sale in a CI run
    with a core burned). Runs after the fixtures' teardown (the runner's
    hook) and before pytest's own (trylast too, registered first, so called
    last)."""
    _collect_leftovers(item, item.stash.get(_FDS_AT_SETUP, set()))


def _collect_leftovers(item: pytest.Item, before: set[tuple[str, str]]) -> None:
    """When a descriptor is open that was not ``before``, collect the garbage and
    list what the collector closed under ``item``'s name."""
    if _open_fds() <= before:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    for warning in caught:
        item.user_properties.append((LEFTOVER_PROPERTY, str(warning.message)))


@pytest.fixture(scope="session")
def run_id() -> str:
    """A short id unique to this test session."""
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def database_url(run_id: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this session, dropped at the end."""
    name = f"flashsale_test_{run_id}"
    yield asyncio.run(create_database(name))
    asyncio.run(drop_database(name))


@pytest.fixture
def key_prefix(run_id: str) -> str:
    """A Redis key prefix unique to one test."""
    return f"t{run_id}{uuid.uuid4().hex[:6]}"


@pytest.fixture
async def redis(key_prefix: str) -> AsyncIterator[Redis]:
    """A client on the shared Redis; deletes the test's keys afterwards."""
    client = Redis.from_url(REDIS_URL)
    yield client
    async for key in client.scan_iter(match=f"{key_prefix}*", count=1000):
        await client.delete(key)
    await client.aclose()


@pytest.fixture
def make_settings(database_url: str, key_prefix: str, redis: Redis) -> Callable[..., Settings]:
    """A factory of settings on the session database and this test's key prefix
    (whose keys the ``redis`` fixture deletes afterwards). A setting given as
    text is read as its GATEWAY_* variable would be (``user_rate="5/s:10"``)."""

    def make(**overrides: Any) -> Settings:
        base: dict[str, Any] = {
            "redis_url": REDIS_URL,
            "database_url": database_url,
            "key_prefix": key_prefix,
            "admin_token": ADMIN_TOKEN,
            "events_stream": f"{key_prefix}:events",
        }
        base.update(overrides)
        text = {name: value for name, value in base.items() if isinstance(value, str)}
        typed = {name: value for name, value in base.items() if name not in text}
        return dataclasses.replace(load({}, text), **typed)

    return make


@pytest.fixture
async def start_gateway(
    make_settings: Callable[..., Settings],
) -> AsyncIterator[Callable[..., Awaitable[TestClient[web.Request, web.Application]]]]:
    """A factory of running gateway apps (in this process) with HTTP test clients.

    These are not under the lag check of gateway processes (testkit.gateways):
    their loop and heap are the test process's, whose full collections over
    every test's objects pause it for 0.1-0.2 s (0.5-0.8 s on a loaded machine),
    so a stall there is the harness's, not the gateway's. Every scenario where
    the loop matters (e2e, chaos, the cluster soak) runs gateway processes.

    Every client is closed even when closing another fails, so one app's failed
    shutdown fails its own test and leaks nothing into the next one's."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(**overrides: Any) -> TestClient[web.Request, web.Application]:
            client = TestClient(_ServedAsInProduction(create_app(make_settings(**overrides))))
            stack.push_async_callback(client.close)
            await client.start_server()
            assert client.server.runner is not None and client.server.runner.server is not None
            # As gateway.server does: plain purchases through the fast path.
            fastpath.install(client.app, client.server.runner.server)
            return client

        yield start


class _ServedAsInProduction(TestServer):
    """aiohttp's test server cancels a handler whose client went away; the gateway's
    own runner (gateway.server) does not, and a purchase cancelled between its Redis
    reservation and its batch leaves the reservation to the reconciler (30 s), which
    a buyer retrying meanwhile sees as ``in_progress``. The tests serve as
    production does."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        kwargs["handler_cancellation"] = False
        return await super()._make_runner(**kwargs)


@pytest.fixture
def sku(key_prefix: str) -> str:
    """A sku name unique to one test."""
    return f"sku-{key_prefix}"
