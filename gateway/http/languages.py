"""The languages the waiting-room page speaks, and which one a request gets.

English (``en``) and Simplified Chinese (``zh-Hans``). ``?lang=`` names one:
``en``, ``zh-Hans``, or ``zh`` or ``zh-CN`` for the latter, exactly as
written; any other value is refused, as the page's other bad parameters are.
Without it, ``Accept-Language`` decides: its entry of highest quality that one
of the two serves (ties in the order listed, ``q=0`` never; ``*`` is
English); failing that, English. Chinese in Traditional script (``zh-TW``,
``zh-Hant``) is not Simplified: it gets English unless the header also lists
a tag of Simplified Chinese.
"""

from __future__ import annotations

from gateway.domain.errors import InvalidRequest
from gateway.domain.numerals import ascii_decimal

ENGLISH = "en"
SIMPLIFIED_CHINESE = "zh-Hans"
LANGUAGES = (ENGLISH, SIMPLIFIED_CHINESE)
# The subtags after "zh" that mean Simplified Chinese: the script, or a region that writes it.
_SIMPLIFIED = frozenset({"hans", "cn", "sg"})
# The values of ?lang=, and the language each names.
LANG_VALUES = {
    "en": ENGLISH,
    "zh-Hans": SIMPLIFIED_CHINESE,
    "zh": SIMPLIFIED_CHINESE,
    "zh-CN": SIMPLIFIED_CHINESE,
}


def language_of(tag: str) -> str | None:
    """The language served for a BCP 47 ``tag`` (any case): ``en`` for English in
    any region, ``zh-Hans`` for ``zh``, ``zh-CN``, ``zh-SG`` and ``zh-Hans[-...]``;
    None for any other tag."""
    subtags = tag.strip().lower().split("-")
    if subtags[0] == "en":
        return ENGLISH
    if subtags[0] == "zh" and (len(subtags) == 1 or subtags[1] in _SIMPLIFIED):
        return SIMPLIFIED_CHINESE
    return None


def _quality(params: str) -> float:
    """An ``Accept-Language`` entry's ``q`` (1 when absent; 0, never chosen, when malformed)."""
    for param in params.split(";"):
        name, _, value = param.strip().partition("=")
        if name.lower() == "q":
            # RFC 9110's qvalue is ASCII digits; anything else is malformed.
            q = ascii_decimal(value.strip(), longest=5)
            return q if q is not None and q <= 1.0 else 0.0
    return 1.0


def negotiate(accept_language: str | None) -> str:
    """The language for an ``Accept-Language`` header (None: absent)."""
    best, best_q = ENGLISH, 0.0
    for entry in (accept_language or "").split(","):
        tag, _, params = entry.partition(";")
        # "*" is any language: the default serves it.
        language = ENGLISH if tag.strip() == "*" else language_of(tag)
        q = _quality(params)
        if language is not None and q > best_q:
            best, best_q = language, q
    return best


def chosen(lang: str | None, accept_language: str | None) -> str:
    """The page's language: ``?lang=`` when given, else :func:`negotiate`'s.

    Raises :class:`InvalidRequest` for a ``lang`` not in :data:`LANG_VALUES`."""
    if lang is None:
        return negotiate(accept_language)
    if lang not in LANG_VALUES:
        raise InvalidRequest(f"lang must be one of {', '.join(LANG_VALUES)}")
    return LANG_VALUES[lang]
