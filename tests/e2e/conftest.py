"""Fixtures of the browser tests: Debian's chromium, and buyers' tabs on the page;
and the error-level log lines of a gateway served in the test's process.

``chromium`` is found, or installed with apt-get, once per session. ``buyers``
opens tabs, each in a context of its own (cookies, storage and cache apart), of
one browser launched for the test module; when the test fails, every tab's
screenshots (one per state it reached, and its last view) are written under
``test-artifacts/waiting-page/<test>/``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import structlog
from playwright.async_api import Browser, BrowserContext, async_playwright

from testkit.browser import ARTIFACTS, Buyer, chromium_executable, write_shots

FAILED = pytest.StashKey[bool]()
# A phone 320 px wide, and a desktop.
PHONE = {"width": 320, "height": 640}
DESKTOP = {"width": 1280, "height": 800}

OpenBuyer = Callable[..., Awaitable[Buyer]]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Mark the item failed, for fixtures that keep evidence of a failure."""
    report = yield
    if report.failed:
        item.stash[FAILED] = True
    return report


@pytest.fixture(scope="session")
def chromium() -> str:
    """The chromium executable (apt-get installs it when missing)."""
    return chromium_executable()


@pytest.fixture
def _function_scoped_runner(
    request: pytest.FixtureRequest, _function_scoped_runner: asyncio.Runner
) -> asyncio.Runner:
    """The event loop of a test that uses the browser, and of its fixtures: the
    test module's, which the browser's Playwright connection is bound to.

    Launching Playwright's driver and chromium took 1-2 s a test; one browser per
    module saves that for all but the first. pytest-asyncio runs a test and its
    function-scoped fixtures on the loop of this fixture of its (one new loop a
    test), and has no public way to give only some tests' fixtures a wider loop:
    hence this override of its internal name. Were that name to change, the
    browser tests would fail loudly (a future attached to a different loop), not
    pass unchecked. Every other test keeps a loop of its own."""
    if "browser" in request.fixturenames:
        runner: asyncio.Runner = request.getfixturevalue("_module_scoped_runner")
        return runner
    return _function_scoped_runner


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser(chromium: str) -> AsyncIterator[Browser]:
    """Chromium, launched once for the test module's browser tests."""
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def buyers(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[OpenBuyer]:
    """A factory of buyers: ``await buyers(origin, viewport=PHONE)`` opens a tab in
    a browser context of its own (separate cookies and session storage), closed
    when the test ends; other keywords are the browser context's
    (``locale="zh-CN"``: its Accept-Language)."""
    opened: list[Buyer] = []
    contexts: list[BrowserContext] = []
    try:

        async def open_buyer(
            origin: str, viewport: dict[str, int] = DESKTOP, **options: Any
        ) -> Buyer:
            context = await browser.new_context(viewport=viewport, **options)  # type: ignore[arg-type]
            contexts.append(context)
            buyer = Buyer(await context.new_page(), origin)
            opened.append(buyer)
            return buyer

        yield open_buyer
        if request.node.stash.get(FAILED, False):
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)
            for i, buyer in enumerate(opened):
                shots = await buyer.all_shots()
                await asyncio.to_thread(write_shots, ARTIFACTS / name / f"buyer-{i}", shots)
    finally:
        for context in contexts:
            await context.close()


@pytest.fixture
def error_lines(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], list[str]]]:
    """A function: the log lines at error level or above so far, structlog's
    and aiohttp's (its server logs an exception it caught as ``Unhandled
    exception``), of a gateway served in this process."""
    with structlog.testing.capture_logs() as lines:

        def errors() -> list[str]:
            found = [str(line) for line in lines if line.get("log_level") in ("error", "critical")]
            found += [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            return found

        yield errors
