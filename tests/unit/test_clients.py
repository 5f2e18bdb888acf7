"""Client addresses: forwarding headers are believed only from trusted proxies."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.http.clients import TrustedProxies, forwarded_for, parse_address
from gateway.settings import SettingsError, load, parse_networks

PROXIES = TrustedProxies(parse_networks("10.0.0.0/8, 127.0.0.1, fd00::/8"))


def client(
    proxies: TrustedProxies,
    peer: str | None,
    headers: dict[str, str] | list[tuple[str, str]],
) -> str | None:
    """The client of a request from ``peer`` with ``headers`` (a list: repeated lines)."""
    return proxies.client(peer, CIMultiDictProxy(CIMultiDict(headers)))


class TestTrustRules:
    """Who the client is, given the connection's peer and its headers."""

    def test_untrusted_peer_headers_are_ignored(self) -> None:
        """A buyer connecting directly cannot name another address."""
        headers = {"X-Forwarded-For": "198.51.100.9", "Forwarded": "for=198.51.100.9"}
        assert client(PROXIES, "203.0.113.5", headers) == "203.0.113.5"

    def test_without_trusted_networks_the_peer_is_the_client(self) -> None:
        """GATEWAY_TRUSTED_PROXIES unset: no header is believed, not even from loopback."""
        nobody = TrustedProxies(parse_networks(None))
        assert client(nobody, "127.0.0.1", {"X-Forwarded-For": "198.51.100.9"}) == "127.0.0.1"

    def test_trusted_peer_forwarded_for_is_taken(self) -> None:
        """HAProxy on a trusted address: the address it appended is the client."""
        assert client(PROXIES, "10.1.2.3", {"X-Forwarded-For": "203.0.113.5"}) == "203.0.113.5"

    def test_chain_rightmost_untrusted_wins(self) -> None:
        """A client-forged entry on the left is skipped: the walk stops at the first
        untrusted address from the right."""
        headers = {"X-Forwarded-For": "6.6.6.6, 203.0.113.5, 10.9.9.9"}
        assert client(PROXIES, "10.1.2.3", headers) == "203.0.113.5"

    def test_chain_of_proxies_only_gives_the_leftmost(self) -> None:
        """Every hop trusted: the farthest one known is the best answer."""
        headers = {"X-Forwarded-For": "10.0.0.7, 10.0.0.8"}
        assert client(PROXIES, "127.0.0.1", headers) == "10.0.0.7"

    def test_garbage_entry_stops_the_walk(self) -> None:
        """An entry that is no address ends the walk at the last address known."""
        headers = {"X-Forwarded-For": "203.0.113.5, unknown, 10.0.0.8"}
        assert client(PROXIES, "127.0.0.1", headers) == "10.0.0.8"

    def test_a_forged_line_before_the_proxys_own_is_not_believed(self) -> None:
        """HAProxy's ``option forwardfor`` appends its own header line after the one
        the buyer sent: the lines are one list, and the proxy's entry is the last."""
        headers = [("X-Forwarded-For", "6.6.6.6"), ("X-Forwarded-For", "203.0.113.5")]
        assert client(PROXIES, "127.0.0.1", headers) == "203.0.113.5"
        forwarded = [("Forwarded", "for=6.6.6.6"), ("Forwarded", "for=203.0.113.7")]
        assert client(PROXIES, "127.0.0.1", forwarded) == "203.0.113.7"

    def test_trusted_peer_without_header_is_itself(self) -> None:
        """A health check from the balancer carries no header: the peer is logged."""
        assert client(PROXIES, "10.1.2.3", {}) == "10.1.2.3"

    def test_forwarded_header_when_there_is_no_x_forwarded_for(self) -> None:
        """RFC 7239 ``for=`` values, quoted IPv6 with a port included."""
        headers = {"Forwarded": 'for=6.6.6.6, for="[2001:db8::17]:4711";proto=http, for=10.0.0.1'}
        assert client(PROXIES, "127.0.0.1", headers) == "2001:db8::17"

    def test_x_forwarded_for_wins_over_forwarded(self) -> None:
        """A Forwarded header a client sent through HAProxy untouched is not believed."""
        headers = {"Forwarded": "for=6.6.6.6", "X-Forwarded-For": "203.0.113.5"}
        assert client(PROXIES, "127.0.0.1", headers) == "203.0.113.5"

    def test_ipv4_mapped_peer_counts_as_ipv4(self) -> None:
        """A dual-stack socket reports ``::ffff:10.1.2.3``: still the trusted proxy."""
        headers = {"X-Forwarded-For": "203.0.113.5"}
        assert client(PROXIES, "::ffff:10.1.2.3", headers) == "203.0.113.5"

    def test_unknown_peer(self) -> None:
        """No peer address (a closed transport): nothing to trust, None is logged."""
        assert client(PROXIES, None, {"X-Forwarded-For": "203.0.113.5"}) is None


class TestParsing:
    """Addresses and header values as proxies write them."""

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("203.0.113.5", "203.0.113.5"),
            (" 203.0.113.5:8080 ", "203.0.113.5"),
            ('"[2001:db8::1]:443"', "2001:db8::1"),
            ("2001:db8::1", "2001:db8::1"),
            ("unknown", None),
            ("_hidden", None),
            ("", None),
        ],
    )
    def test_parse_address(self, text: str, expected: str | None) -> None:
        """Ports and brackets are dropped; an obfuscated identifier is no address."""
        address = parse_address(text)
        assert (None if address is None else str(address)) == expected

    def test_forwarded_for_values_in_order(self) -> None:
        """Only ``for=`` parameters, case-insensitive, left to right."""
        assert forwarded_for("For=1.1.1.1;by=2.2.2.2, proto=https;for=3.3.3.3") == [
            "1.1.1.1",
            "3.3.3.3",
        ]

    def test_setting_rejects_a_bad_network(self) -> None:
        """A typo in GATEWAY_TRUSTED_PROXIES stops the start with the setting named."""
        with pytest.raises(SettingsError, match="GATEWAY_TRUSTED_PROXIES"):
            load({"GATEWAY_TRUSTED_PROXIES": "10.0.0.0/8,10.0.0.300"})
        assert load({"GATEWAY_TRUSTED_PROXIES": "10.0.0.0/8, ::1"}).trusted_proxies
