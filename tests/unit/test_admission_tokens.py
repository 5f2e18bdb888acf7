"""Admission tokens and admin tokens: pure code, no servers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gateway.http.admin_tokens import AdminTokens, fingerprint
from gateway.settings import SettingsError, load
from gateway.usecases.admission_tokens import Admission, Signer

KEY, OLD = "k" * 32, "o" * 32


class TestSigner:
    """A token binds sku, user, ticket and expiry to the secret."""

    def test_round_trip(self) -> None:
        """A token signed for a sku and user verifies for them, with its ticket and expiry."""
        token = Signer(KEY).sign("sku", "alice", "abc123", 1_700_000_000_000)
        assert Signer(KEY).verify(token, "sku", "alice") == Admission("abc123", 1_700_000_000_000)

    @pytest.mark.parametrize(
        ("sku", "user"), [("other", "alice"), ("sku", "bob")], ids=["sku", "user"]
    )
    def test_bound_to_sku_and_user(self, sku: str, user: str) -> None:
        """Shown for another sku or user, the token does not verify."""
        token = Signer(KEY).sign("sku", "alice", "abc123", 5)
        assert Signer(KEY).verify(token, sku, user) is None

    def test_tampered_parts_fail(self) -> None:
        """Changing the ticket or the expiry breaks the signature."""
        ticket, expires, signature = Signer(KEY).sign("s", "u", "abc123", 5).split(".")
        assert Signer(KEY).verify(f"abc124.{expires}.{signature}", "s", "u") is None
        assert Signer(KEY).verify(f"{ticket}.6.{signature}", "s", "u") is None

    @pytest.mark.parametrize("junk", ["", "a.b", "a.1", "a..x", "..", "é.1.x", "a.1.x" * 50])
    def test_malformed_tokens_fail(self, junk: str) -> None:
        """Malformed tokens are refused, not crashed on."""
        assert Signer(KEY).verify(junk, "s", "u") is None

    def test_rotation(self) -> None:
        """The previous secret verifies but never signs; without it, old tokens fail."""
        old_token = Signer(OLD).sign("s", "u", "t1", 5)
        rotating = Signer(KEY, previous=OLD)
        assert rotating.verify(old_token, "s", "u") is not None
        assert Signer(KEY).verify(old_token, "s", "u") is None
        assert Signer(KEY).verify(rotating.sign("s", "u", "t1", 5), "s", "u") is not None

    def test_short_secret_is_refused_at_start(self) -> None:
        """A guessable admission secret stops the start, naming the setting."""
        with pytest.raises(SettingsError, match="GATEWAY_ADMISSION_SECRET"):
            load({"GATEWAY_ADMISSION_SECRET": "short"})


class TestAdminTokens:
    """Admin tokens from the setting and from a file re-read on change."""

    def test_fixed_token(self) -> None:
        """GATEWAY_ADMIN_TOKEN alone: its bearer header passes, with its fingerprint."""
        tokens = AdminTokens("secret-token", None)
        assert tokens.check("Bearer secret-token") == fingerprint("secret-token")
        assert tokens.check("Bearer secret-tokem") is None
        assert tokens.check("secret-token") is None
        assert tokens.check("Bearer ") is None

    def test_file_is_reread_on_change(self, tmp_path: Path) -> None:
        """Two tokens in the file both pass; after a rewrite the removed one fails and
        the reload is logged with fingerprints only."""
        path = tmp_path / "tokens"
        path.write_text("# rotation\nold-one\n\nnew-one\n")
        tokens = AdminTokens(None, str(path))
        assert tokens.configured
        assert tokens.check("Bearer old-one") == fingerprint("old-one")
        assert tokens.check("Bearer new-one") == fingerprint("new-one")
        path.write_text("new-one\n")
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        with capture_logs() as logs:
            assert tokens.check("Bearer old-one") is None
        assert logs[0]["event"] == "admin_tokens_reloaded"
        assert logs[0]["tokens"] == [fingerprint("new-one")]
        assert "new-one" not in repr(logs)

    def test_unreadable_file_keeps_the_last_tokens(self, tmp_path: Path) -> None:
        """A file removed while running (an editor's rename) keeps the tokens last read."""
        path = tmp_path / "tokens"
        path.write_text("only-one\n")
        tokens = AdminTokens(None, str(path))
        path.unlink()
        with capture_logs() as logs:
            assert tokens.check("Bearer only-one") == fingerprint("only-one")
        assert logs[0]["event"] == "admin_token_file_unreadable"

    def test_missing_file_fails_at_start(self, tmp_path: Path) -> None:
        """A token file that does not exist at start-up is an error, not an open door."""
        with pytest.raises(FileNotFoundError):
            AdminTokens(None, str(tmp_path / "absent"))

    def test_no_token_configured(self) -> None:
        """Neither setting: admin routes are off."""
        assert not AdminTokens(None, None).configured

    def test_missing_file_stops_the_start(self, tmp_path: Path) -> None:
        """GATEWAY_ADMIN_TOKEN_FILE naming no file stops the start, naming the setting."""
        with pytest.raises(SettingsError, match="GATEWAY_ADMIN_TOKEN_FILE"):
            load({"GATEWAY_ADMIN_TOKEN_FILE": str(tmp_path / "absent")})
