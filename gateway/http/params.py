"""What a request says besides its body: headers, and numbers in a query.

Headers as the gateway reads them are visible ASCII, or a 400. aiohttp
decodes a header's bytes as UTF-8 with ``surrogateescape``: a byte that is
not UTF-8 (``\\xff``) arrives as a lone surrogate (``\\udcff``), and
the first ``encode()`` of it raises, a 500. Every header the gateway reads
(bearer tokens, admission tokens, request ids) is visible ASCII by its
contract, so :func:`header` refuses anything else where the value enters,
in the header's own name, before any code works on it.

A number in a query string is ASCII digits (gateway.domain.numerals), read
by :func:`query_int` or :func:`query_decimal`: ``limit=²`` or an Arabic-Indic
one is a 400 like ``limit=x``.
"""

from __future__ import annotations

from collections.abc import Mapping

from multidict import CIMultiDictProxy

from gateway.domain.errors import InvalidRequest
from gateway.domain.numerals import ascii_decimal, ascii_int


def header(headers: CIMultiDictProxy[str], name: str) -> str | None:
    """The value of header ``name``, None when absent; raises
    :class:`InvalidRequest` when it holds anything but visible ASCII and
    spaces (a byte that is not ASCII, a control character)."""
    value = headers.get(name)
    if value is None or (value.isascii() and value.isprintable()):
        return value
    raise InvalidRequest(f"{name} must be printable ASCII")


def query_int(query: Mapping[str, str], name: str, *, low: int, high: int, default: int) -> int:
    """The integer ``?name=`` gives, from ``low`` to ``high``, ``default`` when
    absent; raises :class:`InvalidRequest` for anything else."""
    raw = query.get(name)
    if raw is None:
        return default
    # A digit more than ``high`` has is out of range however it is spelled.
    value = ascii_int(raw, longest=len(str(high)) + 1)
    if value is None or not low <= value <= high:
        raise InvalidRequest(f"{name} must be an integer from {low} to {high}")
    return value


def query_decimal(query: Mapping[str, str], name: str, *, high: float, default: float) -> float:
    """The number of ``?name=`` (ASCII digits, one ``.`` at most), from 0 to
    ``high``, ``default`` when absent; raises :class:`InvalidRequest` for anything else."""
    raw = query.get(name)
    if raw is None:
        return default
    value = ascii_decimal(raw)
    if value is None or not 0 <= value <= high:
        raise InvalidRequest(f"{name} must be a number of seconds from 0 to {high:g}")
    return value
