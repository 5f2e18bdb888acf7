"""Client addresses: who sent a request, seen through the proxies we trust.

Behind HAProxy every connection comes from the balancer, so the buyer's
address is in ``X-Forwarded-For`` (or ``Forwarded``). Anyone can send those
headers, so they are believed only when the connection comes from a network
listed in ``GATEWAY_TRUSTED_PROXIES``; then the chain is read from the right
and the first address that is not a trusted proxy is the client (entries
further left were written by whoever that client is, and prove nothing).
``X-Forwarded-For`` wins over ``Forwarded`` because HAProxy's ``option
forwardfor`` appends to it while passing a client's own ``Forwarded`` on
untouched.

The address is logged and keys the per-client rate limit (reserve.lua), and
resolving it costs header parsing, so a request only binds itself
(:func:`bind_request`) and the address is worked out when a log line is
rendered (:func:`add_client`) or a client rate limit applies to the purchase.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, MutableMapping, Sequence
from contextvars import ContextVar
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from gateway.settings import Network

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_address(text: str) -> IPAddress | None:
    """An address from a header or a peer: ``1.2.3.4``, ``1.2.3.4:80``, ``[::1]:80``,
    ``"[::1]"``; IPv4-mapped IPv6 as IPv4; None when it is no address (``unknown``)."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def forwarded_for(value: str) -> list[str]:
    """The ``for=`` values of a ``Forwarded`` header (RFC 7239), left to right."""
    found = []
    for element in value.split(","):
        for pair in element.split(";"):
            name, _, param = pair.strip().partition("=")
            if name.lower() == "for":
                found.append(param)
    return found


class TrustedProxies:
    """The networks whose forwarding headers are believed."""

    def __init__(self, networks: Sequence[Network]) -> None:
        self._networks = tuple(networks)

    def trusts(self, address: IPAddress) -> bool:
        """Whether ``address`` is one of our proxies."""
        return any(address in network for network in self._networks)

    def client(self, peer: str | None, headers: MultiMapping[str]) -> str | None:
        """The client's address given the connection's ``peer`` and the request headers.

        An untrusted (or unknown) peer is the client, whatever it claims. From a
        trusted peer the forwarding chain is walked right to left past trusted
        proxies; the first other address is the client. An entry that is no
        address stops the walk at the last address known, as does the chain's
        left end.
        """
        hop = parse_address(peer) if peer is not None else None
        if hop is None or not self.trusts(hop):
            return peer if hop is None else str(hop)
        # Every line of the header, in order: a proxy that appends (HAProxy's
        # ``option forwardfor``) adds a line after any the client sent, and the
        # lines of a list header are one list (RFC 9110, 5.3).
        xff = headers.getall("X-Forwarded-For", ())
        if xff:
            chain: Iterable[str] = ",".join(xff).split(",")
        else:
            chain = forwarded_for(",".join(headers.getall("Forwarded", ())))
        for entry in reversed(list(chain)):
            address = parse_address(entry)
            if address is None:
                break
            hop = address
            if not self.trusts(address):
                break
        return str(hop)


# The request this context is handling, with the proxies to judge it by; set once
# per request by the error middleware. One context variable set (far cheaper than
# a structlog binding: docs/performance.md) and no header parsing on the
# sold-out path.
_HANDLING: ContextVar[tuple[web.BaseRequest, TrustedProxies] | None] = ContextVar(
    "flashsale_handling", default=None
)


def bind_request(request: web.BaseRequest, proxies: TrustedProxies) -> None:
    """Make ``request`` the one this context's log lines name the client of."""
    _HANDLING.set((request, proxies))


def add_client(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor: ``client``, the address of the request being handled
    (see :meth:`TrustedProxies.client`), worked out only now that a line is written."""
    if "client" not in event:
        client = current_client()
        if client is not None:
            event["client"] = client
    return event


def current_client() -> str | None:
    """The client address of the request this context is handling (see
    :meth:`TrustedProxies.client`), worked out now; None outside a request."""
    handling = _HANDLING.get()
    if handling is None:
        return None
    request, proxies = handling
    return proxies.client(request.remote, request.headers)
