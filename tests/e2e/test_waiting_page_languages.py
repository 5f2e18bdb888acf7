"""Every state the waiting page can show, in each of its languages, in a real
browser (Debian's chromium, via Playwright): each text is there and filled in,
and each state passes the accessibility audit (axe-core, WCAG 2.1 AA, at 320
and 1280 px, no sideways scroll).

The page is the gateway's own document, chosen by the browser's
``Accept-Language`` (its locale); the API it walks is answered by the test
(Playwright's routes), so each state is reached at once, without a sale's
timing: one gateway and one browser per language, a tab per path. The paths
together show every text of the language's file (a test checks that too), and
the page logs a text it has no words for, which fails the walk.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path as FilePath
from typing import Any

import orjson
import pytest
from playwright.async_api import Error, Route

from gateway.http.languages import LANGUAGES
from testkit.browser import TEXTS_OF, Buyer, StartGateway, gateway
from tests.e2e.conftest import PHONE, OpenBuyer

pytestmark = pytest.mark.timeout(600)

SHOP = "https://shop.example"
# WAITING_PAGE_SHOTS=docs saves SHOTS there (docs/waiting-rooms.md's pictures of
# them), by path and language, light and dark.
SHOTS_DIR = os.environ.get("WAITING_PAGE_SHOTS")
SHOTS = {
    ("waiting", "zh-Hans", "light"): "waiting-page-waiting-zh-Hans.png",
    ("admitted", "zh-Hans", "light"): "waiting-page-admitted-zh-Hans.png",
    ("admitted", "en", "dark"): "waiting-page-admitted-dark.png",
    ("waiting", "zh-Hans", "dark"): "waiting-page-waiting-zh-Hans-dark.png",
}
# The browser's locale, so its Accept-Language, for each language.
LOCALES = {"en": "en-GB", "zh-Hans": "zh-CN"}
# An API answer: status, JSON body, headers; HOLD: never answered while the tab
# is looked at; LOST: the connection fails.
Answer = tuple[int, dict[str, Any], dict[str, str]]
HOLD: Answer = (0, {}, {})
LOST: Answer = (-1, {}, {})
# A text's name, or its name and, for each placeholder that is a duration, the duration's text.
Expected = str | tuple[str, dict[str, str]]


@dataclass(frozen=True)
class At:
    """An instant ``seconds`` from when the answer holding it is given (the
    paths are built at import, many minutes before a loaded run walks them)."""

    seconds: float

    def text(self) -> str:
        """The instant in ISO 8601 UTC, counted from now."""
        return (datetime.now(UTC) + timedelta(seconds=self.seconds)).isoformat()


def at(seconds: float) -> At:
    """An instant ``seconds`` from the answer's time."""
    return At(seconds)


def sku_info(room: bool, available: int = 5, **window: At) -> Answer:
    """``GET /v1/skus/{sku}``'s answer."""
    body = {
        "sku": "kick-desk",
        "available": available,
        "strategy": "reserve-batch",
        "waiting_room": room,
    }
    return 200, {"starts_at": None, "ends_at": None, **body, **window}, {}


def standing(**fields: Any) -> Answer:
    """A join's or a poll's answer."""
    return 200, {"ticket": "t-1", "position": 0, "eta_s": 1, "poll_after_s": 30, **fields}, {}


def order(status: str, **fields: Any) -> Answer:
    """A purchase's 201."""
    body = {
        "order_id": "o-42",
        "request_id": "wr-1",
        "sku": "kick-desk",
        "qty": 1,
        "status": status,
    }
    return 201, {**body, **fields}, {}


ADMITTED = standing(status="admitted", admission_token="a.b.c", expires_at=at(600))


@dataclass
class Path:
    """A way to a state: the API's answers in order (the last one repeats), a
    click on Buy when ``purchase`` is set, and the texts each element then shows."""

    name: str
    state: str
    expect: dict[str, Expected]
    skus: list[Answer] = field(default_factory=lambda: [sku_info(room=False)])
    queue: Answer = ADMITTED
    purchase: Answer | None = None
    query: str = ""


PATHS = [
    Path("busy", "joining", {"#wr-status": "joining", "#wr-note": ("busy", {"time": "minutes"})},
         skus=[(429, {"error": "rate_limited"}, {"Retry-After": "60"})]),
    Path("offline", "joining", {"#wr-note": ("offline", {"time": "seconds"})}, skus=[LOST]),
    Path("waiting", "waiting", {"#wr-status": "waiting", "#wr-eta": ("eta", {"time": "days"})},
         skus=[sku_info(room=True)],
         queue=standing(status="waiting", position=1234, eta_s=200_000)),
    Path("next", "waiting", {"#wr-status": "next", "#wr-eta": ("eta", {"time": "hours"})},
         skus=[sku_info(room=True)], queue=standing(status="waiting", position=1, eta_s=5400)),
    Path("line before the start", "not_started",
         {"#wr-status": "not_started", "#wr-eta": ("countdown", {"time": "days_exact"})},
         skus=[sku_info(room=True, starts_at=at(3 * 86400))],
         queue=standing(status="waiting", position=3)),
    Path("hours before the start", "not_started",
         {"#wr-eta": ("countdown", {"time": "hours_exact"})},
         skus=[sku_info(room=False, starts_at=at(5 * 3600))]),
    Path("admitted", "admitted", {"#wr-status": "admitted", "#wr-eta": "admitted_until",
                                  "button#buy": "buy"}, skus=[sku_info(room=True)]),
    Path("turn ended", "turn_ended",
         {"#wr-status": "turn_ended", "#wr-eta": "turn_again", "button#retry": "join_again"},
         skus=[sku_info(room=True)],
         queue=standing(status="admitted", admission_token="a.b.c", expires_at=at(-5))),
    Path("sent to the shop", "admitted", {"#wr-status": "redirecting"},
         skus=[sku_info(room=True)], query=f"&return_to={SHOP}/checkout"),
    Path("buying", "buying", {"#wr-status": "buying"}, purchase=HOLD),
    Path("confirmed", "confirmed", {"#wr-status": "confirmed", "#wr-eta": "order"},
         purchase=order("confirmed")),
    Path("pending payment", "confirmed",
         {"#wr-status": "pending", "#wr-deadline": ("pay_by", {"time": "days_exact"}),
          "a#pay": "pay"},
         purchase=order("pending_payment", pay_by=at(50 * 3600)), query=f"&pay_to={SHOP}/pay"),
    Path("paid", "confirmed", {"#wr-status": "paid"}, purchase=order("paid")),
    Path("expired", "expired",
         {"#wr-status": "expired", "#wr-eta": "again", "button#retry": "retry"},
         purchase=order("expired")),
    Path("cancelled, none left", "expired", {"#wr-status": "cancelled", "#wr-eta": "none_left"},
         skus=[sku_info(room=False), sku_info(room=False, available=0)],
         purchase=order("cancelled")),
    Path("sold out", "sold_out", {"#wr-status": "sold_out"}, skus=[sku_info(False, available=0)]),
    Path("sold out while held", "sold_out",
         {"#wr-status": "sold_out_held", "#wr-eta": ("held_again", {"time": "seconds"})},
         purchase=(409, {"status": "sold_out", "held": 2}, {"Retry-After": "30"})),
    Path("ended", "error", {"#wr-status": "ended"},
         skus=[sku_info(room=False, ends_at=at(-3600))]),
    Path("failed", "error",
         {"#wr-status": "error", "#wr-note": "detail",
          "#wr-eta": ("retry_in", {"time": "seconds"}), "button#retry": "retry"},
         purchase=(503, {"error": "unavailable", "detail": "queue full"}, {"Retry-After": "9"})),
    Path("duplicate", "error", {"#wr-status": "duplicate"},
         purchase=(409, {"status": "duplicate"}, {})),
    Path("in progress", "error", {"#wr-status": "in_progress", "#wr-eta": "retry_in"},
         purchase=(409, {"status": "in_progress"}, {"Retry-After": "2"})),
    Path("bot check", "bot_check", {"#wr-status": "bot_check"}, skus=[sku_info(room=True)],
         queue=(403, {"error": "bot_check_failed", "detail": "bot_token is required"}, {})),
    Path("turn spent", "joining",
         {"#wr-status": "rejoin", "#wr-eta": ("rejoin_in", {"time": "minutes"})},
         skus=[sku_info(room=True)],
         purchase=(403, {"error": "admission_invalid", "detail": "admission token used"}, {})),
]  # fmt: skip


def pattern(texts: dict[str, str], expected: Expected, whole: bool = True) -> str:
    """A regular expression (JavaScript's syntax too) of a text as shown: its
    placeholders filled in with anything, or with the duration text named."""
    name, units = (expected, {}) if isinstance(expected, str) else expected
    parts = []
    for part in re.split(r"(\{\w+\})", texts[name]):
        placeholder = part[1:-1] if part.startswith("{") else None
        if placeholder is None:
            parts.append(re.escape(part))
        elif placeholder in units:
            parts.append(pattern(texts, units[placeholder], whole=False))
        else:
            parts.append(r"[^{}]+?")
    return "^" + "".join(parts) + "$" if whole else "".join(parts)


def names(expected: Expected) -> set[str]:
    """The texts an expectation shows."""
    return {expected} if isinstance(expected, str) else {expected[0], *expected[1].values()}


class FakeApi:
    """The API's answers for one path, given in place of the gateway's; what is
    held is answered only when :meth:`release` aborts it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.skus_asked = 0
        self.held: list[Route] = []

    async def handle(self, route: Route) -> None:
        """Answer a request to ``/v1/`` as the path says."""
        request = route.request
        url = request.url.split("?")[0]
        if "/v1/skus/" in url:
            answer = self.path.skus[min(self.skus_asked, len(self.path.skus) - 1)]
            self.skus_asked += 1
        elif "/v1/queue/" in url:
            answer = self.path.queue
        elif url.endswith("/v1/purchase") and self.path.purchase is not None:
            answer = self.path.purchase
        else:
            answer = (404, {"error": "unknown_request"}, {})
        if answer is HOLD:
            return self.hold(route)
        if answer is LOST:
            await route.abort()
            return
        status, fields, headers = answer
        body = {k: v.text() if isinstance(v, At) else v for k, v in fields.items()}
        await route.fulfill(status=status, body=orjson.dumps(body), headers=headers,
                            content_type="application/json")  # fmt: skip

    def hold(self, route: Route) -> None:
        """Keep ``route`` unanswered until :meth:`release`."""
        self.held.append(route)

    async def release(self) -> None:
        """End every held request (the tab is done with)."""
        for route in self.held:
            await route.abort()


async def walk(buyer: Buyer, path: Path, lang: str) -> None:
    """Take ``path`` in ``buyer``'s tab; assert the state, its texts in ``lang``,
    and its audit."""
    texts = TEXTS_OF[lang]
    api = FakeApi(path)
    await buyer.page.route("**/v1/**", api.handle)
    # return_to: a 204 is no navigation, so the page stays, saying where it sends the buyer.
    await buyer.page.route(f"{SHOP}/**", lambda route: route.fulfill(status=204))
    await buyer.open(f"/wait/kick-desk?user_id=u{PATHS.index(path)}{path.query}")
    if path.purchase is not None:
        await buyer.page.click("button#buy", timeout=5_000)
    expect = {"#wr-title": "title", **path.expect}
    shown = [[selector, pattern(texts, text)] for selector, text in expect.items()]
    try:
        await buyer.page.wait_for_function(
            """(shown) => shown.every(([selector, source]) =>
                 new RegExp(source).test(document.querySelector(selector).textContent))""",
            arg=shown,
            timeout=5_000,
        )
    except Error:
        now = await buyer.page.evaluate(
            "(expect) => expect.map((s) => [s, document.querySelector(s)?.textContent])",
            list(expect),
        )
        raise AssertionError(f"{path.name} at {buyer.page.url}: {now}") from None
    assert await buyer.attr("state") == path.state, path.name
    await buyer.audit(path.name)
    missing = [e for e in buyer.console_errors if e.startswith("waiting page:")]
    assert missing == [] and buyer.page_errors == [], (path.name, missing, buyer.page_errors)
    await keep_shots(buyer, path, lang)
    await api.release()


async def keep_shots(buyer: Buyer, path: Path, language: str) -> None:
    """Under WAITING_PAGE_SHOTS, the views of this path that docs/waiting-rooms.md shows."""
    for (name, lang, scheme), png in SHOTS.items():
        if SHOTS_DIR and (name, lang) == (path.name, language):
            await buyer.page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
            (FilePath(SHOTS_DIR) / png).write_bytes(await buyer.page.screenshot(full_page=True))
            await buyer.page.emulate_media(color_scheme="light")


def test_the_paths_show_every_text() -> None:
    """Between them, the paths show each text of the files: none goes unchecked."""
    shown = {"title"}.union(*(names(e) for path in PATHS for e in path.expect.values()))
    for language in LANGUAGES:
        assert shown == set(TEXTS_OF[language])


@pytest.mark.parametrize("language", LANGUAGES)
async def test_every_state_in_each_language(
    start_gateway: StartGateway, buyers: OpenBuyer, language: str
) -> None:
    """A browser whose locale is the language gets the page in it (``<html
    lang>``); on each path the page reaches its state, shows each text of that
    language filled in (numbers, times and durations as the language writes
    them), logs no missing text, and passes the audit."""
    _, origin = await gateway(start_gateway, waiting_page_return_origins=frozenset({SHOP}))
    first = await buyers(origin, viewport=PHONE, locale=LOCALES[language])
    for path in PATHS:
        buyer = Buyer(await first.page.context.new_page(), origin)
        await walk(buyer, path, language)
        assert await buyer.page.get_attribute("html", "lang") == language
        await buyer.page.close()
