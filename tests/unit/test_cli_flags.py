"""The command line's flags: a renamed flag keeps its first spelling as an alias."""

from __future__ import annotations

import pytest

from gateway.__main__ import build_parser


@pytest.mark.parametrize("flag", ["--redeliver", "--replay"])
def test_a_redelivery_of_one_event_takes_either_spelling(flag: str) -> None:
    """``--redeliver EVENT_ID``, and ``--replay``, its first spelling, name the event."""
    args = build_parser().parse_args(["events", flag, "0b6c4a5e"])
    assert args.redeliver == "0b6c4a5e" and args.redeliver_since is None


@pytest.mark.parametrize("flag", ["--redeliver-since", "--replay-since"])
def test_a_redelivery_since_a_time_takes_either_spelling(flag: str) -> None:
    """``--redeliver-since TIME``, and ``--replay-since``, name the time."""
    args = build_parser().parse_args(["events", flag, "2026-12-06T22:00:00Z"])
    assert args.redeliver_since == "2026-12-06T22:00:00Z" and args.redeliver is None
