"""Numbers from the wire are ASCII digits with one spelling (issue 38): the
helper every path, query, header and token number goes through, an admission
token's expiry, and the catalog's memory of unknown skus, bounded."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.domain.errors import UnknownSku
from gateway.domain.model import Strategy
from gateway.domain.numerals import ascii_decimal, ascii_int
from gateway.redis.layout import KeyTags
from gateway.usecases import catalog as catalog_module
from gateway.usecases.admission_tokens import Signer
from gateway.usecases.catalog import UNKNOWN_MAX, Catalog

KEY = "unit-admission-secret-0123456789"
# Digits Python reads (or isdigit() accepts) that the contract does not:
# superscript two, Arabic-Indic one, mathematical one, fullwidth one.
FOREIGN = ["\u00b2", "\u0661", "\U0001d7d9", "\uff11"]


class TestAsciiNumbers:
    """ascii_int and ascii_decimal take [0-9] and nothing else."""

    @pytest.mark.parametrize(
        "text", [*FOREIGN, "", "-1", "+1", " 1", "1 ", "1_0", "0x1", "1e3", "nan", "1.0"]
    )
    def test_anything_but_ascii_digits_is_no_integer(self, text: str) -> None:
        """Each is None, never an int() error nor another script's value."""
        assert ascii_int(text) is None

    def test_ascii_digits_are_read(self) -> None:
        """Digits within the length are the number they write."""
        assert (ascii_int("0"), ascii_int("007"), ascii_int("1700000000000")) == (
            0,
            7,
            1_700_000_000_000,
        )
        assert ascii_int("12345", longest=4) is None

    def test_canonical_refuses_a_leading_zero(self) -> None:
        """One spelling: ``007`` is not 7, ``0`` is 0."""
        assert ascii_int("007", canonical=True) is None
        assert ascii_int("0", canonical=True) == 0

    @pytest.mark.parametrize("text", [*FOREIGN, "nan", "inf", "1e1", "-0", ".5", "5.", "1..2"])
    def test_anything_but_an_ascii_decimal_is_none(self, text: str) -> None:
        """Python's float() takes most of these; the contract does not."""
        assert ascii_decimal(text) is None

    def test_an_ascii_decimal_is_read(self) -> None:
        """``5`` and ``0.25``."""
        assert (ascii_decimal("5"), ascii_decimal("0.25")) == (5.0, 0.25)


class TestTokenSpelling:
    """A signed admission token has one spelling."""

    def test_a_leading_zero_in_the_expiry_is_refused(self) -> None:
        """``ticket.0<exp>.sig`` carries a genuine signature (it signs the
        number, not its text) and was accepted: now it is malformed."""
        signer = Signer(KEY)
        token = signer.sign("sku", "alice", "abc123", 1_700_000_000_000)
        ticket, expires, signature = token.split(".")
        assert signer.verify(token, "sku", "alice") is not None
        assert signer.verify(f"{ticket}.0{expires}.{signature}", "sku", "alice") is None

    @pytest.mark.parametrize("digit", FOREIGN)
    def test_other_scripts_digits_in_the_expiry_are_refused(self, digit: str) -> None:
        """No exception, no admission: a superscript raised in int()."""
        assert Signer(KEY).verify(f"abc.{digit}.sig", "sku", "alice") is None

    def test_a_signature_that_is_not_ascii_is_refused(self) -> None:
        """A lone surrogate (a header byte that is not UTF-8) raised in encode()."""
        assert Signer(KEY).verify("abc.1.\udcff", "sku", "alice") is None


class _NoSkus:
    """An inventory without skus, counting its queries."""

    def __init__(self) -> None:
        self.queries = 0

    async def sku_info(self, sku: str) -> Any:
        self.queries += 1
        return None


class TestUnknownSkus:
    """The catalog's memory of unknown skus is an LRU of UNKNOWN_MAX."""

    async def test_thousands_of_unknown_skus_are_remembered_up_to_the_bound(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """3,000 distinct unknown skus leave UNKNOWN_MAX remembered (it kept
        them all, forever); the most recent still costs no query, the first
        one costs one again."""
        # Remembered for the whole test, however slow the machine.
        monkeypatch.setattr(catalog_module, "UNKNOWN_TTL_S", 3600.0)
        inventory = _NoSkus()
        catalog = Catalog(inventory, Strategy.RESERVE_BATCH, KeyTags())
        for i in range(3000):
            with pytest.raises(UnknownSku):
                await catalog.get(f"nope-{i}")
        assert catalog.unknown_remembered == UNKNOWN_MAX
        asked = inventory.queries
        with pytest.raises(UnknownSku):
            await catalog.get("nope-2999")
        assert inventory.queries == asked
        with pytest.raises(UnknownSku):
            await catalog.get("nope-0")
        assert inventory.queries == asked + 1
