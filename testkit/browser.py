"""A real browser for the waiting-room page: Debian's chromium, driven by Playwright.

``playwright install`` cannot download browsers here, so the tests launch the
distribution's ``chromium`` through ``executable_path``, installing the package
with apt-get when it is missing (as ``scripts/services.sh`` does for Redis).

:class:`Buyer` is one browser tab on the page. It waits on ``#waiting-room``'s
``data-state`` (never on time), keeps a screenshot of every state it saw, and
records what the page asked for and what its console said, so a test can
assert that no request left the gateway's origin and that nothing went wrong
(:func:`assert_clean`). In every state it reaches, it checks the page at a
phone's width and a desktop's: no sideways scroll, and no WCAG 2.1 AA violation
that axe-core (:mod:`testkit.axe`) finds. :func:`gateway` starts the gateway the
page is served by.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from playwright.async_api import ConsoleMessage, Error, Page, Request

from gateway.http.languages import ENGLISH, LANGUAGES
from gateway.http.waiting_page import PAGES_DIR
from testkit.axe import WCAG_21_AA, axe_source
from testkit.processes import APT_WAIT
from testkit.purchases import Client
from testkit.rooms import SECRET

REPO = Path(__file__).resolve().parents[1]
# Where a failed test's screenshots go, one folder per test.
ARTIFACTS = REPO / "test-artifacts" / "waiting-page"
# The longest a page may take to reach a state it is due in (bounded waits).
STATE_WITHIN_S = 15.0
_CANDIDATES = ("chromium", "chromium-browser")
# What the page says, by language and name: the tests read its words where it does.
TEXTS_OF: dict[str, dict[str, str]] = {
    language: orjson.loads((PAGES_DIR / "texts" / f"{language}.json").read_bytes())
    for language in LANGUAGES
}
TEXTS = TEXTS_OF[ENGLISH]
# Each state is checked as a 320 px phone and a 1280 px desktop show it.
AUDIT_WIDTHS = (320, 1280)
# axe-core's WCAG 2.1 A and AA rules over the whole page: each violation, and where.
_AXE_RUN = """async (tags) => {
  const options = { runOnly: { type: "tag", values: tags }, resultTypes: ["violations"] };
  const found = await axe.run(document, options);
  const where = (v) => v.nodes.map((n) => n.target).join(", ");
  return found.violations.map((v) => `${v.id}: ${v.help} at ${where(v)}`);
}"""

StartGateway = Callable[..., Awaitable[Client]]


def chromium_executable() -> str:
    """The path of Debian's chromium, installed with apt-get first if missing.

    Raises RuntimeError saying what to install when that is not possible."""
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError("the browser tests need chromium: apt-get install chromium")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", *APT_WAIT, "install", "-y", "-q", "chromium"]
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        # A fresh machine has no package lists yet.
        update = ["apt-get", *APT_WAIT, "update", "-q"]
        subprocess.run(update, env=env, capture_output=True, check=True)
        subprocess.run(install, env=env, capture_output=True, check=True)
    found = shutil.which("chromium")
    if found is None:
        raise RuntimeError("apt-get installed chromium, but it is not on PATH")
    return found


@dataclass
class Buyer:
    """One tab on the waiting-room page, with what it saw, asked for and logged."""

    page: Page
    origin: str
    shots: list[tuple[str, bytes]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.page.on("request", self._requested)
        self.page.on("console", self._logged)
        self.page.on("pageerror", lambda error: self.page_errors.append(str(error)))

    def _requested(self, request: Request) -> None:
        self.requests.append(request.url)

    def _logged(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.console_errors.append(message.text)

    @property
    def root(self) -> str:
        """The selector of the page's root element."""
        return "#waiting-room"

    async def open(self, path: str) -> None:
        """Load ``path`` of the gateway (asserts a 200)."""
        response = await self.page.goto(f"{self.origin}{path}")
        assert response is not None and response.status == 200, path

    async def reach(self, state: str, within: float = STATE_WITHIN_S, audit: bool = True) -> None:
        """Wait until ``data-state`` is ``state`` (bounded), keep a screenshot, and
        :meth:`audit` the page; ``audit=False`` where the test times what comes
        next to a second or two (the audit takes about as long; the state walk of
        tests/e2e/test_waiting_page_languages.py audits every state)."""
        selector = f'{self.root}[data-state="{state}"]'
        try:
            await self.page.wait_for_selector(selector, timeout=within * 1000)
        except Error:
            now = await self.attr("state")
            raise AssertionError(
                f"page never reached {state!r} within {within} s (is {now!r})"
            ) from None
        await self.snap(state)
        if audit:
            await self.audit(state)

    async def audit(self, state: str) -> None:
        """At each of :data:`AUDIT_WIDTHS`: nothing wider than the window (no
        sideways scroll) and no violation of WCAG 2.1 AA that axe-core finds; then
        the tab's own size again. axe-core is evaluated into the page (as the
        DevTools console would, which the page's CSP does not govern)."""
        size = self.page.viewport_size
        assert size is not None
        try:
            for width in AUDIT_WIDTHS:
                await self.page.set_viewport_size({"width": width, "height": size["height"]})
                wide = await self.page.evaluate(
                    "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
                )
                assert wide[0] <= wide[1], f"{state} at {width} px scrolls sideways: {wide}"
                if not await self.page.evaluate("typeof axe === 'object'"):
                    await self.page.evaluate(await asyncio.to_thread(axe_source))
                found = await self.page.evaluate(_AXE_RUN, list(WCAG_21_AA))
                assert found == [], f"{state} at {width} px: {found}"
        finally:
            await self.page.set_viewport_size(size)

    async def ticks(self, selector: str, times: int) -> None:
        """Wait until the text of ``selector`` changed ``times`` times, each within
        5 s: a countdown that keeps ticking."""
        for _ in range(times):
            await self.page.wait_for_function(
                "([selector, shown]) => document.querySelector(selector).textContent !== shown",
                arg=[selector, await self.page.text_content(selector)],
                timeout=5_000,
            )

    async def snap(self, state: str) -> None:
        """Keep a screenshot of the page as it is now, named ``state``."""
        self.shots.append((state, await self.page.screenshot(full_page=True)))

    async def attr(self, name: str) -> str | None:
        """``data-<name>`` of ``#waiting-room`` (None when absent)."""
        return await self.page.get_attribute(self.root, f"data-{name}")

    async def text(self, selector: str) -> str:
        """The text of an element of the page."""
        return await self.page.inner_text(selector)

    def foreign_requests(self) -> list[str]:
        """Every request the page made off the gateway's origin (``data:`` aside)."""
        return [u for u in self.requests if not u.startswith((f"{self.origin}/", "data:"))]

    async def all_shots(self) -> list[tuple[str, bytes]]:
        """Every kept screenshot, and one of the page as it is now (if it still is)."""
        shots = list(self.shots)
        with contextlib.suppress(Error):
            shots.append(("last", await self.page.screenshot(full_page=True)))
        return shots


def write_shots(folder: Path, shots: list[tuple[str, bytes]]) -> None:
    """Write screenshots to ``folder`` as ``NN-<state>.png``, in the order taken."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, (state, png) in enumerate(shots):
        (folder / f"{i:02d}-{state}.png").write_bytes(png)


async def gateway(start_gateway: StartGateway, **settings: Any) -> tuple[Client, str]:
    """A gateway that can sign admission tokens; its client and its origin."""
    client = await start_gateway(admission_secret=SECRET, **settings)
    return client, str(client.make_url("")).rstrip("/")


def assert_clean(buyer: Buyer, answered: tuple[int, ...] = ()) -> None:
    """No request left the gateway's origin; no script error; no console error
    but Chromium's own line for each error status ``answered`` (it logs every
    fetch answered 4xx or 5xx, however the page handles it)."""
    assert buyer.foreign_requests() == []
    assert buyer.page_errors == []
    logged = [
        f"Failed to load resource: the server responded with a status of {status} "
        for status in answered
    ]
    assert [e[: len(w)] for e, w in zip(buyer.console_errors, logged, strict=False)] == logged
    assert len(buyer.console_errors) == len(logged), buyer.console_errors
