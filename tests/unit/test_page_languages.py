"""The waiting page's languages: which one a request gets, and that each
language's file of texts says everything the other does, with the same
placeholders, and everything the script asks for."""

from __future__ import annotations

import re

import orjson
import pytest

from gateway.domain.errors import InvalidRequest
from gateway.http.languages import LANGUAGES, chosen, language_of, negotiate
from gateway.http.waiting_page import PAGES_DIR, WaitingPage

EN, ZH = "en", "zh-Hans"
TEXTS = {
    language: orjson.loads((PAGES_DIR / "texts" / f"{language}.json").read_bytes())
    for language in LANGUAGES
}


def placeholders(text: str) -> set[str]:
    """The ``{names}`` a text is filled in with."""
    return set(re.findall(r"\{(\w+)\}", text))


class TestNegotiation:
    """Accept-Language with its q-values, and ?lang= over it."""

    @pytest.mark.parametrize(
        ("tag", "language"),
        [
            ("en", EN),
            ("en-GB", EN),
            ("zh", ZH),
            ("zh-CN", ZH),
            ("ZH-cn", ZH),
            ("zh-Hans", ZH),
            ("zh-Hans-HK", ZH),
            ("zh-SG", ZH),
            ("zh-TW", None),
            ("zh-Hant", None),
            ("zh-HK", None),
            ("fr", None),
            ("*", None),
            ("", None),
        ],
    )
    def test_tags_of_each_language(self, tag: str, language: str | None) -> None:
        """English in any region; Simplified Chinese by script or by region;
        Traditional Chinese is neither."""
        assert language_of(tag) == language

    @pytest.mark.parametrize(
        ("header", "language"),
        [
            (None, EN),
            ("", EN),
            ("zh-CN,zh;q=0.9,en;q=0.8", ZH),
            ("en-US,en;q=0.9,zh-CN;q=0.8", EN),
            ("en;q=0.5, zh;q=0.8", ZH),
            ("fr-FR, de;q=0.9, zh-Hans;q=0.3", ZH),
            ("fr-FR, de;q=0.9", EN),
            ("zh-TW, zh-HK;q=0.9", EN),
            ("zh-TW, zh;q=0.7, en;q=0.5", ZH),
            ("zh;q=0, en;q=0.1", EN),
            ("zh;q=0", EN),
            ("zh;q=banana, en;q=0.2", EN),
            ("zh;q=0.5, en;q=0.5", ZH),
            ("*, zh;q=0.5", EN),
            ("zh, *;q=0.1", ZH),
        ],
    )
    def test_accept_language_by_quality(self, header: str | None, language: str) -> None:
        """The served entry of highest q wins (ties: the first listed); q=0 and a
        malformed q never win; nothing served: English."""
        assert negotiate(header) == language

    def test_lang_overrides_the_header(self) -> None:
        """?lang= names the language whatever Accept-Language says; zh and zh-CN are
        Simplified Chinese."""
        assert chosen("en", "zh-CN") == EN
        for lang in ("zh-Hans", "zh", "zh-CN"):
            assert chosen(lang, "en") == ZH
        assert chosen(None, "zh") == ZH

    @pytest.mark.parametrize("lang", ["", "fr", "zh-TW", "english", "en_US", "en-GB", "ZH"])
    def test_unknown_lang_is_refused(self, lang: str) -> None:
        """A ?lang= other than the four values is a bad request, not a silent
        fallback (the published schema lists them)."""
        with pytest.raises(InvalidRequest, match="lang"):
            chosen(lang, "en")


class TestTexts:
    """One file per language, the same keys and placeholders in each."""

    def test_each_language_has_the_same_keys(self) -> None:
        """No text is missing from either file, nor only in one."""
        assert set(TEXTS[EN]) == set(TEXTS[ZH])

    @pytest.mark.parametrize("name", sorted(TEXTS[EN]))
    def test_each_text_has_the_same_placeholders(self, name: str) -> None:
        """A translation fills in exactly what the English text does."""
        assert placeholders(TEXTS[ZH][name]) == placeholders(TEXTS[EN][name])
        assert TEXTS[ZH][name].strip() and TEXTS[ZH][name] != TEXTS[EN][name]

    def test_every_text_the_script_names_exists(self) -> None:
        """Each ``say("name")`` of waiting.js, and the duration units it names by
        variable, is in the files (the state walk in a browser catches the rest)."""
        script = (PAGES_DIR / "waiting.js").read_text()
        named = set(re.findall(r"""\bsay\(\s*["'](\w+)["']""", script))
        named |= {f"{unit}{exact}" for unit in ("hours", "days") for exact in ("", "_exact")}
        assert len(named) > 30
        assert named <= set(TEXTS[EN])

    def test_each_document_declares_its_language(self) -> None:
        """``<html lang>`` is the document's language; its ETag is its own."""
        page = WaitingPage.build()
        assert set(page.documents) == set(LANGUAGES)
        for language, doc in page.documents.items():
            assert doc.body.startswith(f'<!doctype html>\n<html lang="{language}">'.encode())
            assert doc.headers["Content-Language"] == language
        assert page.documents[EN].etag != page.documents[ZH].etag
