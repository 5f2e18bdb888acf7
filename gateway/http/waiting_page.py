"""The waiting-room page: one HTML document a buyer's browser runs.

``GET /wait/{sku}?user_id=U`` answers the same bytes for every sku and user:
the script reads both from its own URL and asks the API for the rest, so the
document is cacheable (ETag, ``Cache-Control: public``) and only the sku's
data is not. It comes in each of the page's languages
(:mod:`gateway.http.languages`: ``?lang=``, else ``Accept-Language``; so
``Vary: Accept-Language``, an ETag per language). Its style, script and the
language's texts (``gateway/http/pages/``, ``texts/<language>.json``) are
inlined once, at start-up; the ``Content-Security-Policy`` allows exactly that
style and that script by their SHA-256, and connections to the page's own
origin. The texts are a JSON data block, which no browser runs: the script,
the style and so the policy are the same in every language.

A shop that runs its own checkout passes ``return_to``, a URL on one of the
origins of ``GATEWAY_WAITING_PAGE_RETURN_ORIGINS``: the page sends the buyer
there once admitted. ``pay_to``, on one of the same origins, is where the
shop takes payment: an order waiting for it links there, with its request id.
Any other ``return_to`` or ``pay_to`` is a 400 (no open redirect).

A sku's display fields (title, image, price) are the script's to show, from
``GET /v1/skus/{sku}``; the policy lets images load from the page's own origin
and from those of ``GATEWAY_WAITING_PAGE_IMAGE_ORIGINS`` alone, and the admin
API refuses an ``image_url`` on any other (:func:`check_image_url`).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable

from aiohttp import web

from gateway.domain.errors import ImageOriginRefused, InvalidRequest
from gateway.http import languages, payloads
from gateway.settings import origin_of

PAGES_DIR: Traversable = resources.files("gateway.http.pages")


def check_return_to(
    return_to: str | None, allowed: frozenset[str], name: str = "return_to"
) -> None:
    """Refuse a URL (the query parameter ``name``) off the allowed origins;
    raises :class:`InvalidRequest`."""
    if return_to is None:
        return
    if not allowed:
        raise InvalidRequest(f"{name} is not allowed: GATEWAY_WAITING_PAGE_RETURN_ORIGINS is empty")
    if origin_of(return_to) not in allowed:
        raise InvalidRequest(f"{name} must be a URL on an origin the gateway allows")


def check_image_url(image_url: str | None, allowed: frozenset[str]) -> None:
    """Refuse a sku's ``image_url`` off the allowed origins (the page's policy
    would block it); raises :class:`ImageOriginRefused`."""
    if image_url is None:
        return
    if not allowed:
        raise ImageOriginRefused(
            "image_url is not allowed: GATEWAY_WAITING_PAGE_IMAGE_ORIGINS is empty"
        )
    if origin_of(image_url) not in allowed:
        raise ImageOriginRefused(
            "image_url must be on an origin of GATEWAY_WAITING_PAGE_IMAGE_ORIGINS"
        )


def _sha256(text: str) -> str:
    """A CSP hash source of an inline element's exact text."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@dataclass(frozen=True, slots=True)
class Document:
    """The page in one language: its bytes, ETag and headers."""

    body: bytes
    etag: str
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class WaitingPage:
    """The assembled document in each language, and where it may send buyers."""

    documents: Mapping[str, Document]
    return_origins: frozenset[str]
    image_origins: frozenset[str]

    def answer(self, request: web.Request) -> web.Response:
        """``GET /wait/{sku}?user_id=U[&return_to=URL][&pay_to=URL][&lang=L][&bot_token=T]``: the
        page in the language asked for, or 304 on a matching ETag; raises
        :class:`InvalidRequest` for a bad sku, user_id, return_to, pay_to, lang or bot_token
        (the document does not depend on the first four: the script reads them)."""
        payloads.identifier(request.match_info["sku"], "sku")
        if "user_id" not in request.query:
            raise InvalidRequest("user_id is required")
        payloads.identifier(request.query["user_id"], "user_id")
        check_return_to(request.query.get("return_to"), self.return_origins)
        check_return_to(request.query.get("pay_to"), self.return_origins, "pay_to")
        if "bot_token" in request.query:
            # As a join takes it (the page passes it on): refused here, not there.
            payloads.bot_token({"bot_token": request.query["bot_token"]})
        asked = request.query.get("lang")
        doc = self.documents[languages.chosen(asked, request.headers.get("Accept-Language"))]
        if any(tag.value == doc.etag for tag in request.if_none_match or ()):
            resp = web.Response(status=304, headers=doc.headers)
        else:
            resp = web.Response(
                body=doc.body, headers=doc.headers, content_type="text/html", charset="utf-8"
            )
        resp.etag = doc.etag
        return resp

    @classmethod
    def build(
        cls,
        return_origins: frozenset[str] = frozenset(),
        image_origins: frozenset[str] = frozenset(),
        pages: Traversable = PAGES_DIR,
    ) -> WaitingPage:
        """The page in each language, under the policy that allows exactly its
        style and script (:func:`_document`), and images from ``image_origins``."""
        style = (pages / "waiting.css").read_text()
        script = (pages / "waiting.js").read_text()
        # data: for the empty favicon, which keeps browsers from asking for /favicon.ico.
        images = " ".join(["'self'", "data:", *sorted(image_origins)])
        policy = (
            f"default-src 'none'; script-src {_sha256(script)}; style-src {_sha256(style)}; "
            f"connect-src 'self'; img-src {images}; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'"
        )
        headers = {
            "Content-Security-Policy": policy,
            # The page's URL names the buyer: it goes to no other site.
            "Referrer-Policy": "no-referrer",
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "public, max-age=300",
            # The same URL answers each language by its Accept-Language.
            "Vary": "Accept-Language",
        }
        documents = {
            language: _document(pages, language, style, script, headers)
            for language in languages.LANGUAGES
        }
        return cls(documents=documents, return_origins=return_origins, image_origins=image_origins)


def _document(
    pages: Traversable, language: str, style: str, script: str, headers: dict[str, str]
) -> Document:
    """``waiting.html`` in ``language``: its ``lang``, and ``waiting.css``,
    ``waiting.js`` and ``texts/<language>.json`` inlined."""
    # "</" cannot end the data block early: JSON allows "<\/" for it.
    texts = (pages / "texts" / f"{language}.json").read_text().replace("</", "<\\/")
    html = (
        (pages / "waiting.html")
        .read_text()
        .replace("{{lang}}", language)
        .replace("{{style}}", style)
        .replace("{{texts}}", texts)
        .replace("{{script}}", script)
    )
    body = html.encode()
    etag = hashlib.sha256(body).hexdigest()[:20]
    return Document(body, etag, {**headers, "Content-Language": language})
