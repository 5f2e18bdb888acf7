"""Purchase answers written directly (gateway.http.prebuilt): the same bytes aiohttp
would send for the ordinary response, keep-alive kept, and the ordinary response
where a direct one would differ."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from gateway.domain.model import Order, Outcome, Result
from gateway.http.views import purchase_answer, purchase_response
from testkit.purchases import Client, buy, put_sku, wait_sold_out_marked

# Both complete answers are far below this.
READ_MAX = 65536


def _request(sku: str, user: str, extra: str = "", version: str = "1.1") -> bytes:
    body = f'{{"sku": "{sku}", "user_id": "{user}"}}'
    return (
        f"POST /v1/purchase HTTP/{version}\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n{body}"
    ).encode()


async def _answers(
    host: str, port: int, payload: bytes, count: int, *, watch_close: bool = False
) -> tuple[list[bytes], bool]:
    """Send ``payload`` on one connection; the first ``count`` answers, each as its
    head and body, and (with ``watch_close``) whether the server then closed the
    connection within 2 s."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(payload)
        answers = []
        for _ in range(count):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            answers.append(head + await asyncio.wait_for(reader.readexactly(length), 5))
        if not watch_close:
            return answers, False
        closed = await asyncio.wait_for(reader.read(READ_MAX), 2) == b""
        return answers, closed
    except TimeoutError:
        return answers, False
    finally:
        writer.close()


def _without_date(answer: bytes) -> bytes:
    return b"\r\n".join(line for line in answer.split(b"\r\n") if not line.startswith(b"Date:"))


async def _sold_out_gateway(start_gateway: Any, sku: str) -> tuple[Client, str, int]:
    client = await start_gateway()
    await put_sku(client, sku, 1)
    assert (await buy(client, sku, "first"))[0] == 201
    assert (await buy(client, sku, "second"))[0] == 409
    await wait_sold_out_marked(client, sku)
    host, port = client.server.host, client.server.port
    assert port is not None
    return client, host, port


ORDER = Order("o-1", "r-1", "sku-1", "fay", 1)
DIRECT_RESULTS = [
    Result(Outcome.SOLD_OUT),
    Result(Outcome.DUPLICATE),
    Result(Outcome.CONFIRMED, ORDER),
    Result(Outcome.ACCEPTED, request_id="r-2"),
]


@pytest.mark.parametrize("result", DIRECT_RESULTS, ids=lambda r: r.outcome.value)
async def test_the_bytes_are_those_of_the_ordinary_response(result: Result) -> None:
    """An app answering the ordinary ``purchase_response`` and one answering
    directly send the same bytes, the date aside, twice in a row (the second
    from the caches)."""

    async def ordinary(request: web.Request) -> web.StreamResponse:
        return purchase_response(result)

    async def direct(request: web.Request) -> web.StreamResponse:
        resp = purchase_answer(request, result)
        assert not isinstance(resp, web.Response), "not answered directly"
        return resp

    app = web.Application()
    app.router.add_post("/ordinary", ordinary)
    app.router.add_post("/direct", direct)
    async with TestClient(TestServer(app)) as client:
        host, port = client.server.host, client.server.port
        assert port is not None
        sent = []
        for path in ("/ordinary", "/direct", "/direct"):
            request = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n".encode()
            answers, _ = await _answers(host, port, request, 1)
            sent.append(_without_date(answers[0]))
        assert sent[0] == sent[1] == sent[2]


async def test_an_answer_with_headers_of_its_own_is_the_ordinary_one() -> None:
    """``in_progress`` carries Retry-After: it is never written directly."""
    request = make_mocked_request("POST", "/v1/purchase")
    resp = purchase_answer(request, Result(Outcome.IN_PROGRESS))
    assert isinstance(resp, web.Response) and resp.headers["Retry-After"] == "1"


async def test_pipelined_sold_out_answers_keep_the_connection(start_gateway: Any, sku: str) -> None:
    """Two purchases sent back to back on one connection get two whole 409s, in
    order, and the connection stays open."""
    _, host, port = await _sold_out_gateway(start_gateway, sku)
    payload = _request(sku, "late-1") + _request(sku, "late-2")
    answers, closed = await _answers(host, port, payload, 2, watch_close=True)
    assert len(answers) == 2 and not closed
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 409 Conflict\r\n"), answer
        assert answer.endswith(b'{"status":"sold_out"}')
        assert b"Connection:" not in answer


async def test_connection_close_and_http_1_0_get_the_ordinary_answer(
    start_gateway: Any, sku: str
) -> None:
    """A buyer that asks to close, or speaks HTTP/1.0, gets the ordinary response,
    which says it closes, and the connection is closed."""
    _, host, port = await _sold_out_gateway(start_gateway, sku)
    for payload in (
        _request(sku, "late-3", extra="Connection: close\r\n"),
        _request(sku, "late-4", version="1.0"),
    ):
        answers, closed = await _answers(host, port, payload, 1, watch_close=True)
        assert len(answers) == 1 and closed, answers
        assert b" 409 Conflict\r\n" in answers[0]
        assert answers[0].endswith(b'{"status":"sold_out"}')
