"""the fast path (gateway.http.fastpath): a plain ``POST /v1/purchase`` is served beside
the router, and a buyer sees exactly what the router's way in answers.

The router's way in is reached with ``Expect: 100-continue``, which the fast path
leaves to the application (a query string is a 400 there: the purchase takes
none); every comparison sends the same purchase both ways, against the same
in-process gateway.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gateway.http.appkeys import ADMISSIONS, ANSWER, PURCHASES
from gateway.http.clients import TrustedProxies
from gateway.http.fastpath import fast_path
from gateway.http.middlewares import answering
from gateway.ops.answer_log import AnswerLog
from gateway.ops.metrics import Metrics
from gateway.usecases.admission import Admissions
from gateway.usecases.purchases import Purchases
from testkit.metrics import samples
from testkit.purchases import Client, buy, put_sku, wait_sold_out_marked

# The router's way in: what the fast path leaves to the application.
ROUTED = {"Expect": "100-continue"}


async def _both(client: Client, body: bytes, **headers: str) -> list[tuple[int, str, bytes]]:
    """The answer to ``body`` through the fast path and through the router: status,
    content type and body each."""
    answers = []
    for extra in ({}, ROUTED):
        resp = await client.post("/v1/purchase", data=body, headers={**headers, **extra})
        answers.append((resp.status, resp.content_type, await resp.read()))
        resp.release()
    return answers


def _header_names(resp: Any) -> set[str]:
    return {name.lower() for name in resp.headers} - {"date"}


class TestSameAnswers:
    async def test_sold_out_is_the_same_both_ways(self, start_gateway: Any, sku: str) -> None:
        """Sold out: the same 409 body and the same headers (the date aside)."""
        client = await start_gateway()
        await put_sku(client, sku, 1)
        assert (await buy(client, sku, "first"))[0] == 201
        # The first refusal marks the sku sold out in-process (in the background).
        assert (await buy(client, sku, "second"))[0] == 409
        await wait_sold_out_marked(client, sku)
        body = f'{{"sku": "{sku}", "user_id": "late"}}'.encode()
        fast_answer, router_answer = await _both(client, body)
        assert fast_answer == router_answer
        assert fast_answer[0] == 409 and b"sold_out" in fast_answer[2]
        direct = await client.post("/v1/purchase", data=body)
        routed = await client.post("/v1/purchase", data=body, headers=ROUTED)
        assert _header_names(direct) == _header_names(routed)

    @pytest.mark.parametrize(
        "body",
        [b'{"sku": ', b'{"user_id": "u"}', b'{"sku": "SKU", "user_id": "a b"}', b"[1]"],
        ids=["malformed", "no sku", "bad user", "not an object"],
    )
    async def test_invalid_purchases_are_the_same_both_ways(
        self, start_gateway: Any, sku: str, body: bytes
    ) -> None:
        """A malformed purchase gets the same 400 and JSON detail either way."""
        client = await start_gateway()
        await put_sku(client, sku, 5)
        fast_answer, router_answer = await _both(client, body.replace(b"SKU", sku.encode()))
        assert fast_answer == router_answer
        assert fast_answer[0] == 400 and fast_answer[1] == "application/json"

    async def test_unknown_sku_and_bad_key_are_the_same_both_ways(self, start_gateway: Any) -> None:
        """404 unknown_sku, and a 400 for an invalid Idempotency-Key header."""
        client = await start_gateway()
        body = b'{"sku": "no-such-sku", "user_id": "u"}'
        fast_answer, router_answer = await _both(client, body)
        assert fast_answer == router_answer and fast_answer[0] == 404
        fast_answer, router_answer = await _both(client, body, **{"Idempotency-Key": "a b"})
        assert fast_answer == router_answer and fast_answer[0] == 400

    async def test_both_ways_sell_and_are_counted(self, start_gateway: Any, sku: str) -> None:
        """A purchase through either way is confirmed, and each answer is counted
        under the purchase route's outcomes."""
        client = await start_gateway()
        await put_sku(client, sku, 2)
        statuses = []
        for extra, user in (({}, "a"), (ROUTED, "b")):
            resp = await client.post(
                "/v1/purchase", json={"sku": sku, "user_id": user}, headers=extra
            )
            statuses.append(resp.status)
        assert statuses == [201, 201]
        found = samples(await (await client.get("/metrics")).text())
        assert found['flashsale_purchases_total{outcome="confirmed"}'] == 2

    async def test_expect_continue_is_served(self, start_gateway: Any, sku: str) -> None:
        """``Expect: 100-continue`` (left to the application) still buys."""
        client = await start_gateway()
        await put_sku(client, sku, 1)
        resp = await client.post(
            "/v1/purchase", json={"sku": sku, "user_id": "patient"}, expect100=True
        )
        assert resp.status == 201, await resp.text()


class TestWhichWay:
    """Which requests the fast path keeps and which it hands to the application."""

    @staticmethod
    def _fast_path() -> tuple[Any, list[str]]:
        app = web.Application()
        metrics = Metrics()
        app[ANSWER] = answering(TrustedProxies(()), metrics, AnswerLog(metrics.stats), timed=True)
        # Never reached below: the fast path's purchases fail before the use cases.
        app[ADMISSIONS] = cast(Admissions, None)
        app[PURCHASES] = cast(Purchases, None)
        handed: list[str] = []

        async def application(request: web.BaseRequest) -> web.StreamResponse:
            handed.append(f"{request.method} {request.raw_path}")
            return web.Response(status=204)

        return fast_path(app, application), handed

    async def test_plain_purchase_takes_the_fast_path(self) -> None:
        """A plain POST /v1/purchase is answered by the view itself (here its
        413 for a declared body over 4 KiB), without the application."""
        serve, handed = self._fast_path()
        request = make_mocked_request("POST", "/v1/purchase", headers={"Content-Length": "5000"})
        resp = await serve(request)
        assert resp.status == 413 and handed == []

    @pytest.mark.parametrize(
        ("method", "path", "headers"),
        [
            ("GET", "/v1/purchase", {}),
            ("POST", "/v1/purchase?via=router", {}),
            ("POST", "/v1/purchase", {"Expect": "100-continue"}),
            ("POST", "/v1/purchases", {}),
            ("GET", "/healthz", {}),
        ],
    )
    async def test_everything_else_goes_to_the_application(
        self, method: str, path: str, headers: dict[str, str]
    ) -> None:
        serve, handed = self._fast_path()
        resp = await serve(make_mocked_request(method, path, headers=headers))
        assert resp.status == 204 and handed == [f"{method} {path}"]
