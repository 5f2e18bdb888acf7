"""Admission tokens: HMAC-SHA256 over sku, user, ticket and expiry. Pure, no I/O.

A token reads ``<ticket>.<expires_ms>.<signature>``; the sku and the user are
not in it but signed, so the purchase's own sku and user are what it is checked
against: a token shown for another sku or user fails like a forged one. The
signature is base64url (no padding) of HMAC-SHA256 keyed by
``GATEWAY_ADMISSION_SECRET`` over ``sku|user|ticket|expires_ms``. During a
rotation ``GATEWAY_ADMISSION_SECRET_PREVIOUS`` is accepted too (never used to
sign): set the new secret and the old one as previous on every instance, wait
for the longest token TTL, then drop the previous one.

A room's bot check travels in the ticket, and so in the token: a ticket made
by a join whose bot token passed begins with :data:`CHECKED`, which a ticket
made otherwise (hex) never does. Tickets are made by the gateway alone and
signed into the token, so a purchase reads the verdict without I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from gateway.domain.numerals import ascii_int

# Longer than any token we sign: refused before any hashing.
MAX_TOKEN = 160


# The first letter of a ticket made after a bot check passed: not a hex digit.
CHECKED = "h"


class Refusal(StrEnum):
    """Why an admission token was refused: the metric's label."""

    MISSING = "missing"
    FORGED = "forged"  # malformed, or signed for another sku, user, ticket or key
    EXPIRED = "expired"
    USED = "used"  # another request already bought with it
    UNCHECKED = "unchecked"  # its room checks for bots, and its ticket was not checked


def fresh_ticket(*, checked: bool) -> str:
    """A new ticket: 64 random bits in hex, marked :data:`CHECKED` when a bot
    check passed for the join that makes it."""
    return f"{CHECKED if checked else ''}{secrets.token_hex(8)}"


@dataclass(frozen=True, slots=True)
class Admission:
    """A token whose signature checked out."""

    ticket: str
    expires_ms: int

    @property
    def bot_checked(self) -> bool:
        """Whether the ticket was made after a bot check passed."""
        return self.ticket.startswith(CHECKED)


class Signer:
    """Signs with the current secret, verifies with it and the previous one."""

    # It has a secret to sign with (the port's NO_SIGNER has none).
    configured = True

    def __init__(self, secret: str, previous: str | None = None) -> None:
        keys = [secret] if previous is None else [secret, previous]
        self._keys: Sequence[bytes] = [k.encode() for k in keys]

    def sign(self, sku: str, user_id: str, ticket: str, expires_ms: int) -> str:
        """The token admitting ``user_id`` to buy ``sku`` until ``expires_ms``."""
        signature = _signature(self._keys[0], sku, user_id, ticket, expires_ms)
        return f"{ticket}.{expires_ms}.{signature}"

    def verify(self, token: str, sku: str, user_id: str) -> Admission | None:
        """The admission a token grants ``user_id`` for ``sku`` (expiry not checked),
        or None when it is malformed or its signature is not ours."""
        if len(token) > MAX_TOKEN:
            return None
        if not token.isascii():
            # A byte that is not UTF-8 arrives as a lone surrogate, which
            # encode() below would raise on: no token we sign holds one.
            return None
        ticket, _, rest = token.partition(".")
        expires, _, given = rest.partition(".")
        # The expiry as sign() writes it and no other way (no leading zero): a
        # signed token has one spelling.
        expires_ms = ascii_int(expires, canonical=True)
        if not (ticket.isalnum() and expires_ms is not None and given):
            return None
        matched = False
        for key in self._keys:
            # Every key is tried, so the time taken does not tell which one matched.
            expected = _signature(key, sku, user_id, ticket, expires_ms)
            matched |= hmac.compare_digest(expected.encode(), given.encode())
        return Admission(ticket, expires_ms) if matched else None


def _signature(key: bytes, sku: str, user_id: str, ticket: str, expires_ms: int) -> str:
    message = f"{sku}|{user_id}|{ticket}|{expires_ms}".encode()
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
