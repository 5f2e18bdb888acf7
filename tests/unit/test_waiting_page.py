"""Origins of the waiting page's return_to, and their setting."""

from __future__ import annotations

import pytest

from gateway.settings import SettingsError, load, origin_of, parse_origins


class TestOrigins:
    """What counts as an origin, and the same origin written two ways."""

    @pytest.mark.parametrize(
        ("url", "origin"),
        [
            ("https://shop.example/checkout?x=1", "https://shop.example"),
            ("HTTPS://Shop.Example:443", "https://shop.example"),
            ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
            ("http://[::1]:9000/a", "http://[::1]:9000"),
            ("https://user@shop.example/", None),
            ("https://shop.example\\@evil.example/", None),
            ("https://shop.example /", None),
            ("ftp://shop.example/", None),
            ("javascript:alert(1)", None),
            ("//shop.example/", None),
            ("https://shop.example:99999/", None),
        ],
    )
    def test_origin_of(self, url: str, origin: str | None) -> None:
        """scheme://host[:port], lower case, default port dropped; None for the rest."""
        assert origin_of(url) == origin

    def test_setting_parses_a_list(self) -> None:
        """GATEWAY_WAITING_PAGE_RETURN_ORIGINS: comma-separated, normalised."""
        raw = "https://Shop.Example, http://127.0.0.1:8000"
        settings = load({"GATEWAY_WAITING_PAGE_RETURN_ORIGINS": raw})
        assert settings.waiting_page_return_origins == {
            "https://shop.example",
            "http://127.0.0.1:8000",
        }
        assert load({}).waiting_page_return_origins == frozenset()

    @pytest.mark.parametrize(
        "raw", ["https://shop.example/path", "shop.example", "https://a.example,", "https://x?y"]
    )
    def test_setting_refuses_what_is_not_an_origin(self, raw: str) -> None:
        """A path, a bare host or an empty item stops the start with the setting's name."""
        with pytest.raises(ValueError):
            parse_origins(raw)
        with pytest.raises(SettingsError, match="GATEWAY_WAITING_PAGE_RETURN_ORIGINS"):
            load({"GATEWAY_WAITING_PAGE_RETURN_ORIGINS": raw})
