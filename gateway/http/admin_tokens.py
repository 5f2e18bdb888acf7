"""Admin bearer tokens: ``GATEWAY_ADMIN_TOKEN`` and the lines of ``GATEWAY_ADMIN_TOKEN_FILE``.

The file holds one token a line (blank lines and ``#`` comments are skipped);
any of them is accepted, so a rotation writes the new token beside the old
one, moves every client over, then removes the old line. The file is read
again when its mtime, size or inode changed, checked on each admin request
(admin requests are rare; a stat is cheap and needs no signal handling in
every worker). A file that cannot be read keeps the tokens last read, with a
warning: an editor's rename must not lock the operators out.

Admin changes are logged with :func:`fingerprint` of the token that made them,
never the token itself.
"""

from __future__ import annotations

import hashlib
import hmac
import os

import structlog

log = structlog.get_logger(__name__)

BEARER = "Bearer "


def fingerprint(token: str) -> str:
    """A short, non-secret name of a token: the first 8 hex digits of its sha256."""
    return hashlib.sha256(token.encode()).hexdigest()[:8]


def parse_tokens(text: str) -> list[str]:
    """The tokens of a token file's text, one a line."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


class AdminTokens:
    """Which bearer tokens open the admin routes, reloaded when their file changes."""

    def __init__(self, token: str | None, path: str | None) -> None:
        self._fixed = [token] if token else []
        self._path = path
        self._stamp: tuple[int, int, int] | None = None
        self._from_file: list[str] = []
        if path is not None:
            # At start-up a missing file is a mistake to stop on, not to warn about.
            self._from_file = self._read(path)

    @property
    def configured(self) -> bool:
        """Whether any admin token is configured at all (else admin routes are off)."""
        return bool(self._fixed) or self._path is not None

    def check(self, authorization: str) -> str | None:
        """The fingerprint of the token an ``Authorization`` header carries, or None
        when it carries none of ours. Compared in constant time with each token."""
        self._refresh()
        if not authorization.startswith(BEARER):
            return None
        given = authorization.removeprefix(BEARER).encode()
        matched: str | None = None
        for token in (*self._fixed, *self._from_file):
            # No early exit: the time taken does not tell which token matched.
            if hmac.compare_digest(given, token.encode()):
                matched = token
        return None if matched is None else fingerprint(matched)

    def _refresh(self) -> None:
        if self._path is None:
            return
        try:
            self._from_file = self._read(self._path)
        except OSError as exc:
            log.warning("admin_token_file_unreadable", path=self._path, cause=repr(exc))

    def _read(self, path: str) -> list[str]:
        """The file's tokens, read only when it changed since the last read."""
        st = os.stat(path)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return self._from_file
        with open(path, encoding="utf-8") as f:
            tokens = parse_tokens(f.read())
        if self._stamp is not None:
            log.info("admin_tokens_reloaded", path=path, tokens=[fingerprint(t) for t in tokens])
        self._stamp = stamp
        return tokens
