"""A loopback siteverify: the bot check's provider as Turnstile, hCaptcha and
reCAPTCHA document it, for the tests and the bench.

``POST`` form-encoded ``secret``, ``response`` and ``remoteip``; the answer is
JSON ``{"success": bool, "error-codes": [...]}``. A token is chosen by its
prefix: ``pass-`` succeeds, ``fail-`` is refused (``invalid-input-response``),
``boom-`` answers 500, ``hang-`` is held until the test lets it go (a provider
too slow to answer). A wrong secret is ``invalid-input-secret``. Like the real
providers, a token verified once is refused after (``timeout-or-duplicate``),
unless ``duplicates`` is set: then the gateway's own record is all that stops
a second use.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from testkit.webhook_receivers import serving

SECRET = "0x4AAAAAAAtest-siteverify-secret"


@dataclass
class SiteVerify:
    """The provider's state: what it was asked, which tokens it verified."""

    secret: str = SECRET
    duplicates: bool = False
    asked: list[dict[str, str]] = field(default_factory=list)
    verified: set[str] = field(default_factory=set)
    hanging: int = 0
    _released: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        """One siteverify POST."""
        form = {name: str(value) for name, value in (await request.post()).items()}
        self.asked.append(form)
        token = form.get("response", "")
        if token.startswith("hang-"):
            self.hanging += 1
            await self._released.wait()
        if token.startswith("boom-"):
            return web.Response(status=500, text="internal server error")
        if form.get("secret") != self.secret:
            return self._answer(False, "invalid-input-secret")
        if token in self.verified and not self.duplicates:
            return self._answer(False, "timeout-or-duplicate")
        if not token.startswith("pass-"):
            return self._answer(False, "invalid-input-response")
        self.verified.add(token)
        return self._answer(True)

    @staticmethod
    def _answer(success: bool, *codes: str) -> web.Response:
        return web.json_response({"success": success, "error-codes": list(codes)})

    def release(self) -> None:
        """Let held requests go (at the end of a test)."""
        self._released.set()


@contextlib.asynccontextmanager
async def siteverify(provider: SiteVerify | None = None) -> AsyncIterator[tuple[str, SiteVerify]]:
    """Serve a :class:`SiteVerify` on a free loopback port: (its URL, it)."""
    provider = provider or SiteVerify()
    async with serving(provider.handle) as url:
        try:
            yield url.removesuffix("/hook") + "/siteverify", provider
        finally:
            provider.release()
