"""Origins of the waiting page's return_to and of its images, and their settings."""

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


class TestImageOrigins:
    """GATEWAY_WAITING_PAGE_IMAGE_ORIGINS: origins as return_to's are, https
    only but on loopback, where a developer's or a test's server runs."""

    def test_https_and_loopback_http_are_taken(self) -> None:
        """https anywhere; http on 127.0.0.0/8, ::1 and localhost; unset: none."""
        raw = "https://Img.Shop.Example, http://127.0.0.2:8081, http://[::1]:9000, http://localhost"
        settings = load({"GATEWAY_WAITING_PAGE_IMAGE_ORIGINS": raw})
        assert settings.waiting_page_image_origins == {
            "https://img.shop.example",
            "http://127.0.0.2:8081",
            "http://[::1]:9000",
            "http://localhost",
        }
        assert load({}).waiting_page_image_origins == frozenset()

    @pytest.mark.parametrize(
        "raw", ["http://img.shop.example", "http://10.0.0.1:8081", "https://img.example/x"]
    )
    def test_plain_http_off_loopback_stops_the_start(self, raw: str) -> None:
        """An http origin elsewhere (mixed content, open to swapping on the way)
        or anything not an origin stops the start with the setting's name."""
        with pytest.raises(SettingsError, match="GATEWAY_WAITING_PAGE_IMAGE_ORIGINS"):
            load({"GATEWAY_WAITING_PAGE_IMAGE_ORIGINS": raw})
