"""Request bodies: parsed with orjson and checked by hand, cheaply.

A handful of checks is faster than a schema library on the hot path, and the
rules are few: known fields only, each named once, strings of
``[A-Za-z0-9._:-]`` of 1 to 64 characters, and integers that are real JSON
integers (not booleans, not floats).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import orjson

from gateway.domain.errors import DuplicateKey, InvalidRequest
from gateway.domain.model import Purchase, Strategy, WaitingRoom
from gateway.domain.rules import OFF, Rate, parse_instant, parse_rate
from gateway.settings import origin_of

ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,64}")
MAX_BODY = 4096
# The longest Admission-Token header the schema allows (a token is about 80).
MAX_ADMISSION_TOKEN = 160
# Stock and quantities stay far inside PostgreSQL's bigint and Lua's doubles.
MAX_INT = 2**50
MAX_LIMIT = 2**31 - 1

PURCHASE_FIELDS = frozenset({"sku", "user_id", "qty", "request_id"})
SKU_FIELDS = frozenset(
    {
        "stock",
        "per_user_limit",
        "starts_at",
        "ends_at",
        "user_rate",
        "client_rate",
        "waiting_room",
        "strategy",
        "payment_window_s",
        "title",
        "image_url",
        "price_text",
        "limit_group",
    }
)
GROUP_FIELDS = frozenset({"per_user_limit"})
# A limit group's per_user_limit (issue 41).
MAX_GROUP_LIMIT = 1000
ROOM_FIELDS = frozenset({"admit_per_s", "token_ttl_s", "shuffle_at_start", "bot_check"})
JOIN_FIELDS = frozenset({"user_id", "bot_token"})
# The longest bot token taken: Turnstile documents 2048 characters at most.
MAX_BOT_TOKEN = 2048
# A day: a token is meant to be spent within minutes of admission.
MAX_TOKEN_TTL_S = 86_400
RESTOCK_FIELDS = frozenset({"delta"})
# Three days: the longest a sku's units may be held for a buyer who has not paid.
MAX_PAYMENT_WINDOW_S = 259_200
# The display fields' bounds, in characters: a heading, a URL as browsers
# handle them everywhere, and a price with its currency ("¥99", "$12.00").
MAX_IMAGE_URL = 2048
DISPLAY_TEXTS = {"title": 200, "price_text": 40}
# Control characters (C0, DEL, C1) in a display text: a line break or an
# escape sequence there would reach the page and the logs as is.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# A URL's characters once encoded (RFC 3986): printable ASCII, no space.
URL_CHARS = re.compile(r"[!-~]+")


def parse_object(body: bytes, allowed: frozenset[str]) -> dict[str, Any]:
    """Parse a JSON object with only ``allowed`` fields, none of them twice;
    raises :class:`InvalidRequest` (:class:`DuplicateKey` for a field named
    twice, in the object or any object inside it)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidRequest("body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequest("body must be a JSON object")
    # orjson keeps the last value of a repeated key. An object has a comma
    # between members, so a body with fewer commas than the distinct keys found
    # repeats none (nor does any object inside it): one count over a short body
    # on the hot path. Only other bodies are parsed again, pair by pair.
    if len(data) <= body.count(b","):
        _refuse_duplicates(body)
    extra = data.keys() - allowed
    if extra:
        raise InvalidRequest(f"unknown fields: {', '.join(sorted(extra))}")
    return data


def _refuse_duplicates(body: bytes) -> None:
    """Raise :class:`DuplicateKey` if an object of ``body`` (valid JSON, as
    orjson found it) names a key twice."""
    try:
        json.loads(body, object_pairs_hook=_unique)
    except RecursionError:
        # Deeper than the standard library parses (orjson allows 1024 levels).
        raise InvalidRequest("body nests too deep") from None


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """One object's members as a dict; raises :class:`DuplicateKey` for a key given twice."""
    found = dict(pairs)
    if len(found) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(f"{key} is given more than once")
            seen.add(key)
    return found


def identifier(value: object, name: str) -> str:
    """Check an id (sku, user_id, request_id); raises :class:`InvalidRequest`."""
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a string")
    if ID_PATTERN.fullmatch(value) is None:
        raise InvalidRequest(f"{name} must be 1 to 64 characters of A-Z a-z 0-9 . _ : -")
    return value


def integer(
    data: Mapping[str, Any], name: str, *, low: int, high: int = MAX_INT, default: int | None = None
) -> int:
    """Read a JSON integer from ``low`` to ``high``; raises :class:`InvalidRequest`."""
    if name not in data:
        if default is None:
            raise InvalidRequest(f"{name} is required")
        return default
    value = data[name]
    # bool is a subclass of int; JSON true is not a quantity.
    if type(value) is not int:
        raise InvalidRequest(f"{name} must be an integer")
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be from {low} to {high}")
    return value


def strategy(data: Mapping[str, Any]) -> Strategy | None:
    """Read an optional ``strategy`` (absent or null: the gateway's); raises
    :class:`InvalidRequest` for anything but a known strategy's name."""
    value = data.get("strategy")
    if value is None:
        return None
    try:
        return Strategy(value)
    except ValueError:
        raise InvalidRequest(f"strategy must be one of {', '.join(Strategy)}") from None


def idempotency_key(header: str | None) -> str | None:
    """The request id an ``Idempotency-Key`` header names, or None without one.

    draft-ietf-httpapi-idempotency-key-header sends it as a structured-field
    string (``"k1"``); a bare ``k1`` is taken too. Either way it must be a valid
    request id: an invalid header is refused, never ignored.
    """
    if header is None:
        return None
    if len(header) >= 2 and header[0] == header[-1] == '"':
        header = header[1:-1]
    return identifier(header, "Idempotency-Key")


def admission_token(header: str | None) -> str | None:
    """The ``Admission-Token`` header, checked against the schema on every
    purchase, whether or not the sku has a waiting room: a header that breaks
    the published contract is refused, never ignored. Raises
    :class:`InvalidRequest`."""
    if header is not None and len(header) > MAX_ADMISSION_TOKEN:
        raise InvalidRequest(f"Admission-Token must be at most {MAX_ADMISSION_TOKEN} characters")
    return header


def purchase(body: bytes, header: str | None) -> Purchase:
    """Parse ``POST /v1/purchase``; the request id comes from the body, else the
    Idempotency-Key header, else it is left empty for the service to generate.
    Raises :class:`InvalidRequest` when the header is invalid, or names another
    request id than the body's."""
    key = idempotency_key(header)
    data = parse_object(body, PURCHASE_FIELDS)
    for name in ("sku", "user_id"):
        if name not in data:
            raise InvalidRequest(f"{name} is required")
    sku = identifier(data["sku"], "sku")
    user_id = identifier(data["user_id"], "user_id")
    qty = integer(data, "qty", low=1, high=MAX_LIMIT, default=1)
    if "request_id" in data:
        request_id = identifier(data["request_id"], "request_id")
        if key is not None and key != request_id:
            raise InvalidRequest("Idempotency-Key and request_id name different requests")
    elif key is not None:
        request_id = key
    else:
        # Generated by the service once it is needed: a sold-out answer needs none.
        request_id = ""
    return Purchase(sku=sku, user_id=user_id, qty=qty, request_id=request_id)


def waiting_room(data: Mapping[str, Any]) -> WaitingRoom | None:
    """The optional ``waiting_room`` object of ``PUT /admin/skus/{sku}``; raises
    :class:`InvalidRequest`."""
    room = data.get("waiting_room")
    if room is None:
        return None
    if not isinstance(room, dict):
        raise InvalidRequest("waiting_room must be a JSON object")
    extra = room.keys() - ROOM_FIELDS
    if extra:
        raise InvalidRequest(f"unknown waiting_room fields: {', '.join(sorted(extra))}")
    shuffle, bot_check = room.get("shuffle_at_start", False), room.get("bot_check", False)
    if not isinstance(shuffle, bool):
        raise InvalidRequest("shuffle_at_start must be true or false")
    if not isinstance(bot_check, bool):
        raise InvalidRequest("bot_check must be true or false")
    return WaitingRoom(
        admit_per_s=integer(room, "admit_per_s", low=1, high=MAX_LIMIT),
        token_ttl_s=integer(room, "token_ttl_s", low=1, high=MAX_TOKEN_TTL_S),
        shuffle_at_start=shuffle,
        bot_check=bot_check,
    )


def bot_token(data: Mapping[str, Any]) -> str | None:
    """The optional ``bot_token`` of a join: 1 to MAX_BOT_TOKEN printable ASCII
    characters (a widget's token is base64-like), checked whether or not the
    room asks for one. Raises :class:`InvalidRequest`."""
    if "bot_token" not in data:
        return None
    value = data["bot_token"]
    if not isinstance(value, str) or len(value) > MAX_BOT_TOKEN:
        raise InvalidRequest(f"bot_token must be a string of at most {MAX_BOT_TOKEN} characters")
    if URL_CHARS.fullmatch(value) is None:
        raise InvalidRequest("bot_token must be printable ASCII without spaces")
    return value


def sku_fields(data: Mapping[str, Any], *, partial: bool) -> dict[str, Any]:
    """The settings of ``PUT`` (every field; an absent one takes its default:
    ``per_user_limit`` 1, no window, the instance's rates, no waiting room, the
    gateway's strategy, no display fields) or ``PATCH /admin/skus/{sku}`` (only
    the fields given; ``null`` clears one that may be null) as
    :class:`gateway.domain.model.SkuSettings` attributes. Windows are RFC 3339,
    rates ``N/s:burst`` or ``"off"``. Raises
    :class:`InvalidRequest`, also when the window given ends before it starts."""
    named = data.keys() if partial else SKU_FIELDS
    if partial and not named:
        raise InvalidRequest("nothing to change: name at least one field")
    fields: dict[str, Any] = {}
    if "stock" in named:
        fields["stock"] = integer(data, "stock", low=0)
    if "per_user_limit" in named:
        fields["per_user_limit"] = integer(
            data, "per_user_limit", low=1, high=MAX_LIMIT, default=None if partial else 1
        )
    for name in named & {"starts_at", "ends_at"}:
        fields[name] = _instant(data, name)
    for name in named & {"user_rate", "client_rate"}:
        fields[name] = _rate(data, name)
    if "waiting_room" in named:
        fields["waiting_room"] = waiting_room(data)
    fields.update(_selling_fields(data, named))
    fields.update(_display_fields(data, named))
    starts, ends = fields.get("starts_at"), fields.get("ends_at")
    if starts is not None and ends is not None and ends <= starts:
        raise InvalidRequest("ends_at must be after starts_at")
    return fields


def _selling_fields(data: Mapping[str, Any], named: Iterable[str]) -> dict[str, Any]:
    """How the sku sells: its strategy, payment window and limit group (absent
    or null: left as it is)."""
    fields: dict[str, Any] = {}
    if "strategy" in named:
        fields["strategy"] = strategy(data)
    if "payment_window_s" in named:
        fields["payment_window_s"] = integer(
            data, "payment_window_s", low=0, high=MAX_PAYMENT_WINDOW_S, default=0
        )
    if data.get("limit_group") is not None:
        fields["limit_group"] = limit_group(data["limit_group"])
    return fields


def limit_group(value: object) -> str | None:
    """A sku's ``limit_group``: a group's name, or ``""`` to leave its group
    (None); ``null`` or absent leaves it as it is, so the caller sees no field."""
    if value == "":
        return None
    return identifier(value, "limit_group")


def _display_fields(data: Mapping[str, Any], named: Iterable[str]) -> dict[str, str | None]:
    """The display fields among ``named``, each checked (null: none)."""
    fields: dict[str, str | None] = {}
    for name in named:
        if name in DISPLAY_TEXTS:
            fields[name] = display_text(data.get(name), name, DISPLAY_TEXTS[name])
        elif name == "image_url":
            fields[name] = image_url(data.get(name))
    return fields


def display_text(value: object, name: str, longest: int) -> str | None:
    """A display field's text (``title``, ``price_text``): null, or 1 to
    ``longest`` characters without control characters; raises :class:`InvalidRequest`."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a string or null")
    if not 1 <= len(value) <= longest:
        raise InvalidRequest(f"{name} must be 1 to {longest} characters")
    if CONTROL.search(value):
        raise InvalidRequest(f"{name} must not contain control characters")
    return value


def image_url(value: object) -> str | None:
    """A sku's ``image_url``: null, or an absolute http(s) URL of at most
    MAX_IMAGE_URL printable ASCII characters, without credentials; whether its
    origin is allowed is the waiting page's to say
    (:func:`gateway.http.waiting_page.check_image_url`). Raises :class:`InvalidRequest`."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest("image_url must be a string or null")
    valid = len(value) <= MAX_IMAGE_URL and URL_CHARS.fullmatch(value) is not None
    if not valid or origin_of(value) is None:
        raise InvalidRequest(
            f"image_url must be an http(s) URL of at most {MAX_IMAGE_URL} printable ASCII"
            " characters, without credentials"
        )
    return value


def _instant(data: Mapping[str, Any], name: str) -> datetime | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be an RFC 3339 date-time string")
    try:
        return parse_instant(value)
    except ValueError as exc:
        raise InvalidRequest(f"{name} {exc}") from None


def _rate(data: Mapping[str, Any], name: str) -> Rate | str | None:
    value = data.get(name)
    if value is None or value == OFF:
        return value
    if not isinstance(value, str):
        raise InvalidRequest(f'{name} must be a string "N/s:burst" or "off"')
    try:
        return parse_rate(value)
    except ValueError as exc:
        raise InvalidRequest(f"{name} {exc}") from None
