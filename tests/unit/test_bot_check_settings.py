"""The bot check's settings, and the join body's ``bot_token`` and the room's
``bot_check`` as the edge reads them: a configuration that cannot work is
refused when it is made."""

from __future__ import annotations

import pytest

from gateway.domain.errors import InvalidRequest
from gateway.domain.model import WaitingRoom
from gateway.http import payloads
from gateway.settings import SettingsError, load

URL = "https://challenges.cloudflare.com/turnstile/v0/siteverify"
SECRET = "1x0000000000000000000000000000000AA"


def test_off_by_default_and_both_read() -> None:
    """No bot check unless both are set; both are read as given."""
    assert (load({}).bot_check_url, load({}).bot_check_secret) == (None, None)
    s = load({"GATEWAY_BOT_CHECK_URL": URL, "GATEWAY_BOT_CHECK_SECRET": SECRET})
    assert (s.bot_check_url, s.bot_check_secret) == (URL, SECRET)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"GATEWAY_BOT_CHECK_URL": URL}, "GATEWAY_BOT_CHECK_URL needs GATEWAY_BOT_CHECK_SECRET"),
        ({"GATEWAY_BOT_CHECK_SECRET": SECRET}, "GATEWAY_BOT_CHECK_SECRET needs"),
        (
            {"GATEWAY_BOT_CHECK_URL": "ftp://verify.example/", "GATEWAY_BOT_CHECK_SECRET": SECRET},
            "must be an http(s) URL with a host",
        ),
        (
            {"GATEWAY_BOT_CHECK_URL": "http://verify.example/", "GATEWAY_BOT_CHECK_SECRET": SECRET},
            "secret in clear",
        ),
        ({"GATEWAY_BOT_CHECK_URL": URL, "GATEWAY_BOT_CHECK_SECRET": "a b"}, "without spaces"),
    ],
)
def test_a_bot_check_that_cannot_work_is_refused(env: dict[str, str], named: str) -> None:
    """One without the other, a URL that is not http(s), plain http beyond
    loopback (the secret would travel in clear), a secret with spaces."""
    with pytest.raises(SettingsError, match=named.replace("(", r"\(").replace(")", r"\)")):
        load(env)


def test_plain_http_to_loopback_is_taken() -> None:
    """A siteverify of the developer's own (or the tests') on loopback."""
    env = {"GATEWAY_BOT_CHECK_URL": "http://127.0.0.1:9/siteverify"}
    assert (
        load({**env, "GATEWAY_BOT_CHECK_SECRET": SECRET}).bot_check_url
        == env["GATEWAY_BOT_CHECK_URL"]
    )


@pytest.mark.parametrize("bad", [7, None, "", "a b", "é", "x" * 2049, ["t"]])
def test_a_bot_token_is_printable_ascii(bad: object) -> None:
    """A join's bot_token: 1 to 2048 printable ASCII characters, else 400."""
    with pytest.raises(InvalidRequest):
        payloads.bot_token({"bot_token": bad})


def test_a_bot_token_is_optional() -> None:
    """Absent: None; a widget's token is taken as is."""
    assert payloads.bot_token({}) is None
    token = "0.Zx-_/+=" + "a" * 2000
    assert payloads.bot_token({"bot_token": token}) == token


def test_the_room_setting() -> None:
    """``bot_check`` is a boolean, off by default, answered only when on."""
    room = {"admit_per_s": 5, "token_ttl_s": 60}
    assert payloads.waiting_room({"waiting_room": room}) == WaitingRoom(5, 60)
    checked = payloads.waiting_room({"waiting_room": {**room, "bot_check": True}})
    assert checked is not None and checked.as_json()["bot_check"] is True
    assert "bot_check" not in WaitingRoom(5, 60).as_json()
    with pytest.raises(InvalidRequest, match="bot_check must be true or false"):
        payloads.waiting_room({"waiting_room": {**room, "bot_check": "yes"}})
