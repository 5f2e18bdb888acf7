"""Numbers as the wire writes them: ASCII digits, parsed in one place.

Every number the gateway reads from a path, a query string, a header or an
admission token goes through here. Python's own tests are wider than the
contract: ``str.isdigit()`` is true for superscripts (``²``), which ``int()``
then refuses, a 500; ``int()`` and ``float()`` read other scripts' digits
(Arabic-Indic, mathematical, fullwidth) as ours, and take signs, spaces, underscores and
``nan``. So a number is ``[0-9]`` characters and nothing else (a decimal one
may have one ``.`` between digits), and these return None for anything else,
for the caller to refuse in its own words.
"""

from __future__ import annotations

import re

# [0-9], not \d: \d matches any script's digits.
_INTEGER = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")
# Longer than any number the gateway takes (an expiry in ms has 13 digits):
# refused before int() works through it.
MAX_DIGITS = 18


def ascii_int(text: str, *, longest: int = MAX_DIGITS, canonical: bool = False) -> int | None:
    """The integer ``text`` writes in ASCII digits alone (no sign, space or
    underscore), at most ``longest`` of them; None for any other text.

    ``canonical`` refuses a leading zero too (``0`` itself aside), so a signed
    value has one spelling only."""
    if len(text) > longest or _INTEGER.fullmatch(text) is None:
        return None
    if canonical and len(text) > 1 and text[0] == "0":
        return None
    return int(text)


def ascii_decimal(text: str, *, longest: int = MAX_DIGITS) -> float | None:
    """The number ``text`` writes as ASCII digits with at most one ``.`` between
    them (``5``, ``0.25``), at most ``longest`` characters; None for any other
    text (``nan``, ``1e3``, ``-1``, ``.5``, another script's digits)."""
    if len(text) > longest or _DECIMAL.fullmatch(text) is None:
        return None
    return float(text)
