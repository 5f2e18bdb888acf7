"""The bot check: a bot token verified with the provider that issued it.

Cloudflare Turnstile, hCaptcha and reCAPTCHA verify alike ("siteverify"): one
form-encoded POST of ``secret``, ``response`` (the token) and ``remoteip``;
the answer is JSON whose ``success`` is true for a token the provider vouches
for. Each provider refuses a token it has already verified
(``timeout-or-duplicate``), so a token is good for one verification anywhere.

A 200 with ``success`` not true is the buyer's refusal (403). No answer within
``TIMEOUT_S``, a connection error, another status, a body that is not JSON,
or a refusal that blames us (our secret) or the provider (its internal error)
is :class:`BotCheckUnavailable` (503): the join fails closed, and the buyer
may retry.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import structlog

from gateway.domain.errors import BotCheckUnavailable
from gateway.settings import Settings

log = structlog.get_logger(__name__)

# The longest a join waits for the provider, connecting included: a buyer at
# the door waits no longer, and a provider that slow is treated as down.
TIMEOUT_S = 2.0
# Connections to the provider at once: kept alive and reused, so a flash crowd
# of joins pays no handshake each; more joins than this wait for one (within
# the same TIMEOUT_S).
CONCURRENCY = 256
# Of an answer's body, the most read: a siteverify answer is a few hundred bytes.
ANSWER_READ_BYTES = 64 * 1024
# error-codes that are not the token's fault: our secret, or the provider itself.
NOT_THE_BUYERS = frozenset(
    {"missing-input-secret", "invalid-input-secret", "internal-error", "sitekey-secret-mismatch"}
)


class SiteVerify:
    """Verifies bot tokens at GATEWAY_BOT_CHECK_URL, on one connection pool."""

    def __init__(self, settings: Settings, timeout_s: float = TIMEOUT_S) -> None:
        if settings.bot_check_url is None or settings.bot_check_secret is None:
            raise ValueError("a bot check needs GATEWAY_BOT_CHECK_URL and GATEWAY_BOT_CHECK_SECRET")
        self._url, self._secret = settings.bot_check_url, settings.bot_check_secret
        self._timeout_s = timeout_s
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CONCURRENCY),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        )

    @property
    def configured(self) -> bool:
        """Always: it is made only with its settings."""
        return True

    async def passes(self, token: str, remote_ip: str | None) -> bool:
        """Whether the provider vouches for ``token`` (shown from ``remote_ip``,
        sent when known); raises :class:`BotCheckUnavailable` when it cannot say."""
        form = {"secret": self._secret, "response": token}
        if remote_ip is not None:
            form["remoteip"] = remote_ip
        try:
            async with self._session.post(self._url, data=form, allow_redirects=False) as answer:
                status = answer.status
                body = await answer.content.read(ANSWER_READ_BYTES)
        except TimeoutError:
            raise BotCheckUnavailable(
                f"bot check: no answer within {self._timeout_s:g}s", retry_after=1
            ) from None
        except aiohttp.ClientError as exc:
            raise BotCheckUnavailable(f"bot check: {type(exc).__name__}", retry_after=1) from None
        if status != 200:
            raise BotCheckUnavailable(f"bot check: the provider answered {status}", retry_after=1)
        return self._verdict(body)

    def _verdict(self, body: bytes) -> bool:
        """True for ``{"success": true}``; False for the buyer's refusal."""
        try:
            answer: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise BotCheckUnavailable("bot check: the answer is not JSON", retry_after=1) from None
        if not isinstance(answer, dict):
            raise BotCheckUnavailable("bot check: the answer is not an object", retry_after=1)
        if answer.get("success") is True:
            return True
        codes = answer.get("error-codes")
        named = {c for c in codes if isinstance(c, str)} if isinstance(codes, list) else set()
        ours = NOT_THE_BUYERS & named
        if ours:
            # Every join fails while this lasts: the operator has to know.
            log.error("bot_check_refused_us", codes=sorted(ours))
            raise BotCheckUnavailable(f"bot check: {', '.join(sorted(ours))}", retry_after=5)
        return False

    async def close(self) -> None:
        """Close the connection pool."""
        await self._session.close()
