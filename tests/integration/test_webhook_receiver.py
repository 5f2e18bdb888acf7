"""The receivers of docs/events.md, the whole one and "In short"'s few lines, run as written
against what the webhook sink sends: a good request is kept, a tampered body,
a wrong secret and a stale signature are refused."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.outbound.webhook import SIGNATURE_HEADER, WebhookSink, signature
from gateway.settings import load
from testkit.order_events import order_events
from testkit.webhook_receivers import serving

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"
SECRET = "receiver-test-secret-0123456789"


def documented_receiver() -> dict[str, Any]:
    """The names the doc's one Python block defines, with SECRET set to ours."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/events.md has one receiver example"
    names: dict[str, Any] = {"__name__": "webhook_receiver_doc"}
    exec(compile(blocks[0], str(DOC), "exec"), names)
    names["SECRET"] = SECRET
    return names


async def test_the_documented_handler_keeps_what_the_sink_signed() -> None:
    """The doc's aiohttp handler answers 204 to the sink's POST, so it counts as
    delivered, and keeps the body under its event id; a sink with another
    secret gets 400 and nothing is kept."""
    receiver = documented_receiver()
    app = web.Application()
    kept: dict[str, bytes] = {}
    app[receiver["EVENTS"]] = kept
    events = order_events(3)
    async with serving(receiver["receive"], app) as url:
        for secret, expected in ((SECRET, None), ("another-secret-0123456789", "answered 400")):
            env = {"GATEWAY_WEBHOOK_URL": url, "GATEWAY_WEBHOOK_SECRET": secret}
            sink = WebhookSink(load(env), Counter[str]().update)
            try:
                assert list(await sink.deliver(events)) == [expected] * 3
            finally:
                await sink.close()
    assert kept == {e.event_id: e.body() for e in events}


def test_verify_refuses_a_tampered_body_a_wrong_secret_and_a_stale_signature() -> None:
    """``verify`` holds for the body signed now and within 5 minutes, and for
    nothing else: another body, another secret, a t 301 s old or ahead, a
    malformed header."""
    verify = documented_receiver()["verify"]
    body = order_events(1)[0].body()
    now = int(time.time())
    good = signature(SECRET, body, now)
    assert verify(SECRET, body, good)
    assert verify(SECRET, body, good, now=now + 299)
    assert not verify(SECRET, body.replace(b'"qty":1', b'"qty":9'), good)
    assert not verify("wrong-secret-0123456789", body, good)
    assert not verify(SECRET, body, signature(SECRET, body, now - 301))
    assert not verify(SECRET, body, signature(SECRET, body, now + 301))
    for bad in ("", "t=abc,v1=00", "v1=00", f"t={now}", good.replace("v1=", "v0=")):
        assert not verify(SECRET, body, bad), bad
    assert SIGNATURE_HEADER == "Flashsale-Signature"


def test_the_short_verify_holds_for_the_sinks_signature_alone() -> None:
    """The few lines of docs/events.md's "In short" accept the signature the
    sink sends for a body now, and refuse another body, another secret, a
    signature 301 s old and a malformed header."""
    (block,) = re.findall(r"```python verify\n(.*?)```", DOC.read_text(), re.S)
    names: dict[str, Any] = {"__name__": "webhook_receiver_readme"}
    exec(compile(block, str(DOC), "exec"), names)
    verify = names["verify"]
    body = order_events(1)[0].body()
    now = int(time.time())
    good = signature(SECRET, body, now)
    assert verify(SECRET, body, good)
    assert not verify(SECRET, body.replace(b'"qty":1', b'"qty":9'), good)
    assert not verify("wrong-secret-0123456789", body, good)
    assert not verify(SECRET, body, signature(SECRET, body, now - 301))
    for bad in ("", "t=abc,v1=00", f"t={now}", good.replace("v1=", "v0=")):
        assert not verify(SECRET, body, bad), bad
