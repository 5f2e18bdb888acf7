"""Parsing of sale rules: rates ``N/s:burst`` and RFC 3339 windows."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.domain.rules import Rate, effective, epoch_ms, parse_instant, parse_rate, rfc3339
from gateway.settings import SettingsError, load


class TestRates:
    """``N/s:burst`` is the only form a rate takes."""

    @pytest.mark.parametrize(("text", "rate"), [("5/s:10", Rate(5, 10)), ("0.5/s:1", Rate(0.5, 1))])
    def test_a_rate_reads_as_tokens_per_second_and_burst(self, text: str, rate: Rate) -> None:
        """Whole and fractional rates parse, and print back as written."""
        assert parse_rate(text) == rate
        assert str(parse_rate(text)) == text

    @pytest.mark.parametrize("text", ["5/s", "5/m:10", "0/s:1", "5/s:0", "-1/s:2", "off", ""])
    def test_anything_else_is_refused(self, text: str) -> None:
        """A missing burst, another unit, zero or a word is a ValueError."""
        with pytest.raises(ValueError, match=r"N/s:burst|positive"):
            parse_rate(text)

    def test_a_skus_rate_wins_and_off_switches_the_default_off(self) -> None:
        """None keeps the default, a rate replaces it, "off" leaves none."""
        default = Rate(5, 10)
        assert effective(None, default) == default
        assert effective(Rate(1, 1), default) == Rate(1, 1)
        assert effective("off", default) is None

    def test_a_bad_rate_setting_stops_the_start_naming_it(self) -> None:
        """GATEWAY_USER_RATE=fast is refused with the variable's name."""
        with pytest.raises(SettingsError, match="GATEWAY_USER_RATE"):
            load({"GATEWAY_USER_RATE": "fast"})
        assert load({"GATEWAY_CLIENT_RATE": "2/s:4"}).client_rate == Rate(2, 4)


class TestInstants:
    """Windows are RFC 3339 date-times with an offset."""

    def test_offsets_are_kept_and_shown_in_utc(self) -> None:
        """``+02:00`` and ``Z`` name instants; the API shows them in UTC."""
        instant = parse_instant("2026-12-01T11:00:00+02:00")
        assert instant == datetime(2026, 12, 1, 9, tzinfo=UTC)
        assert rfc3339(instant) == "2026-12-01T09:00:00.000Z"
        assert parse_instant("2026-12-01t09:00:00.5z") == datetime(
            2026, 12, 1, 9, 0, 0, 500_000, tzinfo=UTC
        )

    @pytest.mark.parametrize(
        "text", ["2026-12-01T09:00:00", "2026-12-01", "2026-13-01T09:00:00Z", "soon"]
    )
    def test_a_time_without_offset_or_not_a_time_is_refused(self, text: str) -> None:
        """A naive time would mean each gateway's own zone: refused like garbage."""
        with pytest.raises(ValueError):
            parse_instant(text)

    @pytest.mark.parametrize(
        "text",
        [
            "0001-01-01T00:00:00Z",
            "0001-01-01T00:00:00+01:00",
            "9999-12-31T23:59:59-01:00",
            "1999-12-31T23:59:59.999Z",
            "2000-01-01T00:30:00+01:00",
            "2026-02-30T09:00:00Z",
            "٢٠٢٦-12-01T09:00:00Z",
        ],
    )
    def test_an_instant_no_layer_can_hold_is_refused(self, text: str) -> None:
        """Issue 38: a window's instant must hold in Python, in PostgreSQL and as
        epoch milliseconds, its offset applied: years 2000 to 9999 in UTC, ASCII
        digits, a real date; anything else is refused as it enters."""
        with pytest.raises(ValueError):
            parse_instant(text)

    def test_the_ends_of_the_range_are_taken(self) -> None:
        """The first and last instants of the range parse, and each is shown
        and turned into epoch milliseconds without an error."""
        for text, shown in [
            ("2000-01-01T00:00:00Z", "2000-01-01T00:00:00.000Z"),
            ("9999-12-31T23:59:59.999+00:00", "9999-12-31T23:59:59.999Z"),
            ("2000-01-01T01:00:00+01:00", "2000-01-01T00:00:00.000Z"),
        ]:
            instant = parse_instant(text)
            assert rfc3339(instant) == shown
            assert epoch_ms(instant) is not None
