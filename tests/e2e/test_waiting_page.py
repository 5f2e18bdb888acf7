"""GET /wait/{sku} over HTTP: the document, its policy and caching, and what it refuses."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Awaitable, Callable

import pytest

from testkit.purchases import Client, put_sku
from testkit.rooms import SECRET, put_room_sku

StartGateway = Callable[..., Awaitable[Client]]
SHOP = "https://shop.example"


def csp_hash(text: str) -> str:
    """The CSP source that allows an inline element with exactly ``text``."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


class TestDocument:
    """One cacheable document under a policy that allows only its own code."""

    @pytest.mark.parametrize("lang", ["en", "zh-Hans"])
    async def test_page_is_small_self_contained_and_locked_down(
        self, start_gateway: StartGateway, lang: str
    ) -> None:
        """In each language: 200 text/html under 30 KB with the #waiting-room root;
        the CSP allows exactly its inline script and style (by hash), connections
        to its own origin, and nothing else; no element loads anything from elsewhere."""
        client = await start_gateway()
        resp = await client.get(f"/wait/any-sku?user_id=u1&lang={lang}")
        assert resp.status == 200
        assert resp.content_type == "text/html" and resp.charset == "utf-8"
        body = await resp.text()
        assert len(body.encode()) < 30 * 1024
        assert 'id="waiting-room" data-state="joining"' in body
        policy = resp.headers["Content-Security-Policy"]
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
        scripts = re.findall(r"<script>(.*?)</script>", body, re.S)
        styles = re.findall(r"<style>(.*?)</style>", body, re.S)
        assert len(scripts) == 1 and len(styles) == 1
        assert directives["default-src"] == "'none'"
        assert directives["script-src"] == csp_hash(scripts[0])
        assert directives["style-src"] == csp_hash(styles[0])
        assert directives["connect-src"] == "'self'"
        assert "unsafe" not in policy
        assert not re.search(r"""(src|href)=["'](https?:)?//""", body)

    async def test_same_document_for_every_buyer_cacheable_with_etag(
        self, start_gateway: StartGateway
    ) -> None:
        """The bytes do not depend on sku or user (the script reads them from the
        URL), so the page is publicly cacheable; a matching If-None-Match is a 304."""
        client = await start_gateway()
        first = await client.get("/wait/sku-a?user_id=u1")
        second = await client.get("/wait/sku-b?user_id=u2")
        assert await first.read() == await second.read()
        assert "public" in first.headers["Cache-Control"]
        etag = first.headers["ETag"]
        assert etag == second.headers["ETag"]
        again = await client.get("/wait/sku-a?user_id=u1", headers={"If-None-Match": etag})
        assert again.status == 304 and await again.read() == b""

    async def test_sku_answer_says_whether_it_has_a_room(
        self, start_gateway: StartGateway, sku: str
    ) -> None:
        """GET /v1/skus/{sku} tells the page whether to queue."""
        client = await start_gateway(admission_secret=SECRET)
        await put_room_sku(client, sku, stock=1)
        plain = f"{sku}-plain"
        await put_sku(client, plain, 1)
        assert (await (await client.get(f"/v1/skus/{sku}")).json())["waiting_room"] is True
        assert (await (await client.get(f"/v1/skus/{plain}")).json())["waiting_room"] is False


class TestLanguages:
    """English or Simplified Chinese, by Accept-Language or ?lang=."""

    async def test_accept_language_chooses_the_document(self, start_gateway: StartGateway) -> None:
        """zh-CN gets the Simplified Chinese document (``<html lang="zh-Hans">``, its
        own ETag), anything else English; the answer varies by the header."""
        client = await start_gateway()
        answers = {}
        for header, lang in [("zh-CN,zh;q=0.9,en;q=0.8", "zh-Hans"), ("fr, en;q=0.5", "en")]:
            resp = await client.get("/wait/sku-a?user_id=u1", headers={"Accept-Language": header})
            assert resp.status == 200 and resp.headers["Content-Language"] == lang
            assert f'<html lang="{lang}">' in await resp.text()
            assert resp.headers["Vary"] == "Accept-Language"
            answers[lang] = resp.headers["ETag"]
        assert answers["zh-Hans"] != answers["en"]

    async def test_lang_overrides_accept_language(self, start_gateway: StartGateway) -> None:
        """?lang=zh (or zh-CN, zh-Hans) and ?lang=en win over the header: the same bytes
        as the header's own choice."""
        client = await start_gateway()
        zh_header = {"Accept-Language": "zh-CN"}
        chinese = await (await client.get("/wait/sku-a?user_id=u1", headers=zh_header)).read()
        english = await (await client.get("/wait/sku-a?user_id=u1")).read()
        for lang in ("zh", "zh-CN", "zh-Hans"):
            resp = await client.get(f"/wait/sku-a?user_id=u1&lang={lang}", headers={})
            assert await resp.read() == chinese
        resp = await client.get("/wait/sku-a?user_id=u1&lang=en", headers=zh_header)
        assert await resp.read() == english

    async def test_etag_is_per_language(self, start_gateway: StartGateway) -> None:
        """The Chinese document's ETag is a 304 for a Chinese request, and the whole
        English document for an English one."""
        client = await start_gateway()
        zh = {"Accept-Language": "zh"}
        etag = (await client.get("/wait/sku-a?user_id=u1", headers=zh)).headers["ETag"]
        again = await client.get("/wait/sku-a?user_id=u1", headers={**zh, "If-None-Match": etag})
        assert again.status == 304 and again.headers["Vary"] == "Accept-Language"
        other = await client.get("/wait/sku-a?user_id=u1&lang=en", headers={"If-None-Match": etag})
        assert other.status == 200 and '<html lang="en">' in await other.text()


class TestRefusals:
    """Bad parameters are a 400 with a JSON body; return_to is never an open redirect."""

    @pytest.mark.parametrize(
        "query",
        [
            "",
            "?user_id=",
            "?user_id=has%20space",
            "?user_id=u1&return_to=https://evil.example/",
            "?user_id=u1&return_to=https://shop.example.evil.example/",
            "?user_id=u1&return_to=https://shop.example@evil.example/",
            "?user_id=u1&return_to=https://shop.example%5C@evil.example/",
            "?user_id=u1&return_to=http://shop.example/",
            "?user_id=u1&return_to=//shop.example/",
            "?user_id=u1&return_to=javascript:alert(1)",
            "?user_id=u1&return_to=https://shop.example:8443/",
            "?user_id=u1&pay_to=https://evil.example/pay",
            "?user_id=u1&pay_to=//shop.example/pay",
            "?user_id=u1&pay_to=javascript:alert(1)",
            "?user_id=u1&return_to=https://shop.example/&pay_to=https://shop.example@evil.example/",
            "?user_id=u1&lang=fr",
            "?user_id=u1&lang=zh-TW",
            "?user_id=u1&lang=",
        ],
    )
    async def test_bad_query_is_400_json(self, start_gateway: StartGateway, query: str) -> None:
        """A missing or malformed user_id, a return_to or pay_to off the allowed
        origins, or a lang the page does not speak."""
        client = await start_gateway(waiting_page_return_origins=frozenset({SHOP}))
        resp = await client.get(f"/wait/sku-a{query}")
        assert resp.status == 400
        assert (await resp.json())["error"] == "invalid_request"

    async def test_bad_sku_is_400_json(self, start_gateway: StartGateway) -> None:
        """A sku name the API would refuse is refused here too."""
        client = await start_gateway()
        resp = await client.get("/wait/bad$sku?user_id=u1")
        assert resp.status == 400 and (await resp.json())["error"] == "invalid_request"

    @pytest.mark.parametrize("name", ["return_to", "pay_to"])
    async def test_url_on_allowed_origin_is_served(
        self, start_gateway: StartGateway, name: str
    ) -> None:
        """Any path on an allowed origin will do (default port or not); with no
        origin configured every return_to and pay_to is refused."""
        client = await start_gateway(waiting_page_return_origins=frozenset({SHOP}))
        for target in (f"{SHOP}/checkout?step=2", "HTTPS://Shop.Example:443/x"):
            resp = await client.get("/wait/sku-a", params={"user_id": "u1", name: target})
            assert resp.status == 200, target
        closed = await start_gateway()
        resp = await closed.get("/wait/sku-a", params={"user_id": "u1", name: SHOP})
        assert resp.status == 400
