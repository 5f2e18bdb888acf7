"""Hostile clients against a real gateway process, over real sockets: slow
requests are dropped, oversized heads refused as JSON, connections capped;
admin tokens come from a file that is re-read on change."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from gateway.http.admin_tokens import fingerprint
from testkit.gateways import GatewayCluster
from testkit.metrics import metric, samples
from testkit.polling import wait_for
from testkit.services import REDIS_URL

READ_TIMEOUT_S = 1.5
MAX_CONNECTIONS = 6
# How long a test waits for the gateway to drop a connection: well past the
# deadline, so a busy machine does not fail it, well short of what a slow
# client would hold without one.
DROPPED_WITHIN = READ_TIMEOUT_S + 8


def tokens_file(folder: Path) -> Path:
    """``folder``'s admin-tokens file, holding one token."""
    tokens = folder / "admin-tokens"
    tokens.write_text("# current\nfile-token-one\n")
    return tokens


@contextlib.asynccontextmanager
async def hostile_gateway(
    database_url: str, key_prefix: str, tokens: Path
) -> AsyncIterator[GatewayCluster]:
    """One gateway process with a short read deadline and a small connection cap,
    its admin tokens in the file ``tokens`` (besides GATEWAY_ADMIN_TOKEN)."""
    async with GatewayCluster(
        1,
        redis_url=REDIS_URL,
        database_url=database_url,
        key_prefix=key_prefix,
        settings={
            "request_read_timeout_s": READ_TIMEOUT_S,
            "max_connections": MAX_CONNECTIONS,
            "admin_token_file": str(tokens),
        },
    ) as cluster:
        yield cluster


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(
    database_url: str, run_id: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[GatewayCluster]:
    """The hostile gateway of the module's tests that open a connection or two
    each, which the gateway or the test closes, and change nothing: one process
    for them all (a start is 1.5-2 s). The lag check runs once, at the end."""
    tokens = tokens_file(tmp_path_factory.mktemp("hostile"))
    async with hostile_gateway(database_url, f"t{run_id}{uuid.uuid4().hex[:6]}", tokens) as cluster:
        yield cluster


@pytest.fixture
async def own_gateway(
    database_url: str, key_prefix: str, tmp_path: Path
) -> AsyncIterator[GatewayCluster]:
    """A hostile gateway of the test's own: for a test that counts the open
    connections (another test's last one may not be closed yet) or rewrites the
    tokens file."""
    async with hostile_gateway(database_url, key_prefix, tokens_file(tmp_path)) as cluster:
        yield cluster


async def connect(cluster: GatewayCluster) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw TCP connection to the gateway."""
    return await asyncio.open_connection("127.0.0.1", cluster[0].port)


async def response(reader: asyncio.StreamReader, within: float) -> tuple[int, dict[str, object]]:
    """Read one whole response (the gateway closes after it); status and JSON body."""
    raw = await asyncio.wait_for(reader.read(), within)
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


class TestSlowClients:
    """A request must arrive whole within GATEWAY_REQUEST_READ_TIMEOUT_S."""

    async def test_slowloris_head_is_dropped(self, gateway: GatewayCluster) -> None:
        """A client sending its request head one byte every 0.4 s is answered 408 and
        disconnected long before it could finish."""
        reader, writer = await connect(gateway)
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 60 + b"\r\n\r\n"
        sent = 0
        for byte in head:
            if reader.at_eof() or writer.is_closing():
                break
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                break
            sent += 1
            try:
                data = await asyncio.wait_for(reader.read(4096), 0.4)
            except TimeoutError:
                continue
            assert b" 408 " in data.split(b"\r\n")[0] and b"request_timeout" in data
            break
        else:
            pytest.fail("the slow head was read to its end")
        assert sent < len(head)
        writer.close()

    async def test_a_silent_connection_is_dropped(self, gateway: GatewayCluster) -> None:
        """A connection that sends nothing gets 408 and is closed."""
        reader, writer = await connect(gateway)
        status, body = await response(reader, DROPPED_WITHIN)
        assert (status, body) == (408, {"error": "request_timeout"})
        writer.close()

    @pytest.mark.parametrize(
        "route", ["POST /v1/purchase", "POST /v1/queue/s1", "PUT /admin/skus/s1"]
    )
    async def test_a_trickled_body_is_answered_408(
        self, gateway: GatewayCluster, route: str
    ) -> None:
        """A whole head announcing a body that never comes, through the fast path,
        the router and an admin route: a JSON 408 request_timeout, as for a slow
        head, and the connection is closed."""
        reader, writer = await connect(gateway)
        writer.write(
            f"{route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {gateway.admin_token}\r\n".encode()
        )
        writer.write(b"Content-Length: 40\r\n\r\n{")
        await writer.drain()
        status, body = await response(reader, DROPPED_WITHIN)
        assert (status, body["error"]) == (408, "request_timeout")
        writer.close()

    async def test_a_prompt_keep_alive_client_is_served(self, gateway: GatewayCluster) -> None:
        """Requests on one keep-alive connection, each sent whole, are all answered,
        however long the connection lives between them."""
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1), timeout=aiohttp.ClientTimeout(total=5)
        ) as http:
            for _ in range(3):
                async with http.get(f"{gateway[0].url}/healthz") as resp:
                    assert resp.status == 200
            await asyncio.sleep(READ_TIMEOUT_S * 1.5)  # idle between requests is allowed
            async with http.get(f"{gateway[0].url}/healthz") as resp:
                assert resp.status == 200


class TestOversizedHeads:
    """Heads over the limits get a JSON 4xx, not a 500 or a hang."""

    @pytest.mark.parametrize(
        "extra",
        [b"X-Big: " + b"a" * 5000 + b"\r\n", b"".join(b"X-%d: 1\r\n" % i for i in range(60))],
        ids=["header too long", "too many headers"],
    )
    async def test_refused_as_json(self, gateway: GatewayCluster, extra: bytes) -> None:
        """An oversized header, or too many of them: a JSON 4xx, then the close."""
        reader, writer = await connect(gateway)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n")
        await writer.drain()
        status, body = await response(reader, DROPPED_WITHIN)
        assert 400 <= status < 500 and body["error"] in ("invalid_request", "headers_too_large")
        writer.close()


class TestConnectionCap:
    """At most GATEWAY_MAX_CONNECTIONS open connections per process."""

    async def test_connections_beyond_the_cap_get_503_and_a_close(
        self, own_gateway: GatewayCluster
    ) -> None:
        """With the cap's worth of connections open, the next one is answered 503 at
        once and closed; when one closes, a new connection is served again."""
        held = [await connect(own_gateway) for _ in range(MAX_CONNECTIONS)]
        for reader, writer in held:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            assert b" 200 " in await asyncio.wait_for(reader.readline(), 5)
        reader, writer = await connect(own_gateway)
        status, body = await response(reader, 5)
        assert (status, body) == (503, {"error": "unavailable"})
        writer.close()
        held.pop()[1].close()

        async def served() -> bool:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http,
                http.get(f"{own_gateway[0].url}/healthz") as resp,
            ):
                return resp.status == 200

        await wait_for(served, within=5, what="a connection served after one closed")
        for _, w in held:
            w.close()
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
            http.get(f"{own_gateway[0].url}/metrics") as resp,
        ):
            assert metric(samples(await resp.text()), "flashsale_connections_refused_total") >= 1


class TestAdminTokenFile:
    """GATEWAY_ADMIN_TOKEN_FILE: every line a token, re-read when it changes."""

    async def test_rotation_through_the_file(
        self, own_gateway: GatewayCluster, tmp_path: Path
    ) -> None:
        """The file's token works beside GATEWAY_ADMIN_TOKEN; after the file is
        rewritten with two new tokens the old one is refused and both new ones work;
        each change is logged with the token's fingerprint, never the token."""
        url = f"{own_gateway[0].url}/admin/skus/rot"

        async def put(token: str) -> int:
            headers = {"Authorization": f"Bearer {token}"}
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
                http.put(url, json={"stock": 1}, headers=headers) as resp,
            ):
                return resp.status

        assert await put("file-token-one") == 200
        assert await put(own_gateway.admin_token) == 200
        (tmp_path / "admin-tokens").write_text("file-token-two\nfile-token-three\n")
        assert await put("file-token-one") == 401
        assert await put("file-token-two") == 200
        assert await put("file-token-three") == 200
        changes = own_gateway[0].log_events("admin_change")
        assert [c["token"] for c in changes] == [
            fingerprint(t)
            for t in (
                "file-token-one",
                own_gateway.admin_token,
                "file-token-two",
                "file-token-three",
            )
        ]
        assert "file-token" not in own_gateway[0].log_text()
