"""Headers and query strings fuzzed against a gateway served as in production
(issue 38): no answer is a 500, every refusal is JSON, nothing is logged at
error level. Schemathesis covers the bodies (tests/e2e/test_contract.py); this
sends what it does not: bytes that are not UTF-8, other scripts' digits,
numbers Python reads and the contract does not, encodings and expectations.

Seeded and bounded (a few hundred requests, a few seconds at most): the same
requests every run, so a failure names the request that found it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable

import orjson
import pytest

from gateway.settings import Settings
from testkit.ports import free_port
from testkit.purchases import ADMIN_HEADERS
from testkit.raw_http import PAYMENT_TOKEN, ROOM, exchange, request, served
from testkit.rooms import SECRET

SEED = 38
REQUESTS = 400
# Stops sending past this (loop time), whatever the count: bounded in time on
# a loaded machine too. A run cut short still checked every answer it got.
WITHIN_S = 20.0

# Values that have broken, or could break, a parser of numbers or headers.
NASTY: list[bytes] = [
    b"",
    b"0",
    b"1",
    b"007",
    b"-1",
    b"+1",
    b"1_0",
    b" 1",
    b"1e3",
    b"nan",
    b"inf",
    b"0x10",
    b"1.5",
    b"99999999999999999999999",
    "²".encode(),
    "\u0661".encode(),
    "\U0001d7d9".encode(),
    "\uff11".encode(),
    b"\xff",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"%ff",
    b"%C2%B2",
    b"%00",
    b"a" * 200,
    b"\t",
    b'"quoted"',
    b"Bearer ",
    b"Bearer \xff",
    b"Bearer " + ADMIN_HEADERS["Authorization"].removeprefix("Bearer ").encode(),
    b"Bearer " + PAYMENT_TOKEN.encode(),
    b"t1.0123.sig",
    b"t1.\xff.sig",
    "t1.\u0661\u0662.sig".encode(),
    b"gzip",
    b"br",
    b"zstd",
    b"deflate",
    b"identity",
    b"100-continue",
    b"200-ok",
    b"en;q=\xff",
    "zh;q=\uff10.5".encode(),
    b'W/"\xff"',
    b"*",
    b"127.0.0.1, \xff",
    b"for=\xff",
]
HEADERS = [
    "Authorization",
    "Admission-Token",
    "Idempotency-Key",
    "Content-Encoding",
    "Expect",
    "Accept-Language",
    "If-None-Match",
    "X-Forwarded-For",
    "Forwarded",
    "Content-Type",
    "Accept",
    "Accept-Encoding",
    "Range",
]
QUERY_NAMES = [
    "limit",
    "after",
    "status",
    "wait",
    "user_id",
    "sku",
    "lang",
    "return_to",
    "pay_to",
    "x",
]


def routes(sku: str) -> list[tuple[str, str]]:
    """(method, path) of every route, on the test's skus."""
    room = f"{sku}r"
    return [
        ("POST", "/v1/purchase"),
        ("GET", "/v1/orders/r1"),
        ("GET", f"/v1/skus/{sku}"),
        ("POST", f"/v1/queue/{room}"),
        ("GET", f"/v1/queue/{room}/t1"),
        ("GET", f"/wait/{room}"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("PUT", f"/admin/skus/{sku}z"),
        ("PATCH", f"/admin/skus/{sku}"),
        ("POST", f"/admin/skus/{sku}/restock"),
        ("GET", f"/admin/skus/{sku}"),
        ("GET", "/admin/skus"),
        ("POST", "/admin/reconcile"),
        ("POST", "/v1/orders/r1/pay"),
        ("POST", "/v1/orders/r1/cancel"),
        ("GET", "/admin/late-payments"),
        ("POST", "/v1/orders/r1/refund"),
        ("GET", "/v1/orders"),
        ("GET", "/v1/late-payments"),
        ("POST", "/v1/late-payments/p1/refund"),
        ("POST", "/admin/orders/r1/cancel"),
        ("POST", "/admin/orders/r1/refund"),
        ("GET", "/nowhere"),
    ]


def bodies(sku: str) -> dict[str, bytes]:
    """A plausible body per route kind."""
    return {
        "/v1/purchase": orjson.dumps({"sku": sku, "user_id": "u1"}),
        "queue": orjson.dumps({"user_id": "u1"}),
        "pay": orjson.dumps({"payment_id": "p1"}),
        "orders/r1/refund": orjson.dumps({"restock": True, "reason": "returned"}),
        "restock": orjson.dumps({"delta": 1}),
        "skus": orjson.dumps({"stock": 1}),
    }


def body_for(path: str, sku: str) -> bytes:
    """The body sent to ``path``."""
    known = bodies(sku)
    for key, body in known.items():
        if key in path:
            return body
    return b""


def generate(rng: random.Random, sku: str) -> tuple[bytes, str]:
    """One random request, and a short description of it for a failure."""
    method, path = rng.choice(routes(sku))
    pairs = [
        rng.choice(QUERY_NAMES).encode() + b"=" + rng.choice(NASTY) for _ in range(rng.randrange(3))
    ]
    target = path.encode() + (b"?" + b"&".join(pairs) if pairs else b"")
    # A space or a control byte would break the request line, which the
    # parser refuses before any of our code: percent-encode those.
    target = target.replace(b" ", b"%20").replace(b"\t", b"%09")
    headers: dict[str, str | bytes] = {
        name: rng.choice(NASTY) for name in rng.sample(HEADERS, rng.randrange(4))
    }
    body = body_for(path, sku) if method != "GET" else b""
    return request(method, target, headers, body), f"{method} {target!r} {headers!r}"


@pytest.fixture
async def port(make_settings: Callable[..., Settings], sku: str) -> AsyncIterator[int]:
    """A served gateway with a plain sku and a waiting-room sku."""
    chosen = free_port()
    settings = make_settings(port=chosen, payment_token=PAYMENT_TOKEN, admission_secret=SECRET)
    async with served(settings):
        for name, fields in ((sku, {}), (f"{sku}r", {"waiting_room": ROOM})):
            body = orjson.dumps({"stock": 100, **fields})
            head = {"Authorization": ADMIN_HEADERS["Authorization"]}
            answer = await exchange(chosen, request("PUT", f"/admin/skus/{name}", head, body))
            assert answer.status == 200, answer.body
        yield chosen


async def test_fuzzed_headers_and_queries_never_get_a_500(
    port: int, sku: str, error_lines: Callable[[], list[str]]
) -> None:
    """REQUESTS seeded requests, each a route with nasty query values and
    headers: every answer is below 500, every refusal is JSON, and no line
    is logged at error level."""
    rng = random.Random(SEED)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WITHIN_S
    broken: list[str] = []
    sent = 0
    while sent < REQUESTS and loop.time() < deadline:
        raw, what = generate(rng, sku)
        answer = await exchange(port, raw)
        sent += 1
        if answer.status >= 500 or (answer.status >= 400 and not answer.is_json):
            broken.append(f"{answer.status} for {what}: {answer.body[:200]!r}")
    assert broken == []
    assert error_lines() == []
    assert sent >= 50, "too few requests made it in time to say anything"
