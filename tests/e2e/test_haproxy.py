"""Behind a real HAProxy (deploy/haproxy.cfg): a rolling restart in the middle of
a storm, the public door serving buyer routes only, a long poll held past the
storm-sized server timeout, and every answer HAProxy gives itself in JSON.

HAProxy and two gateway processes start once for the module, on the shared
Redis and the session's database, under a key prefix of their own.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Iterator

import aiohttp
import pytest
from redis.asyncio import Redis

from gateway.audit import audit
from gateway.domain import Verdict
from gateway.layout import rejected_key
from gateway.settings import Settings
from gateway.streams import Streams
from tests.support.driver import ClientPolicy, DriverSummary, LoadDriver
from tests.support.gateways import SIGTERM_EXIT_S, Gateway, GatewayCluster
from tests.support.haproxy import (
    Answer,
    HAProxy,
    MisbehavingGateway,
    check_config,
    exchange,
    get,
    received,
)
from tests.support.invariants import check_invariants
from tests.support.metrics import scrape
from tests.support.polling import wait_for
from tests.support.ports import HOST, free_port
from tests.support.purchases import db_state
from tests.support.rooms import SECRET
from tests.support.services import REDIS_URL

# Longer than HAProxy needs to take a gateway out (fall 2, inter 1s).
LAME_DUCK_S = 3
# Buyers arrive for 45 s and the stock lasts about 27 s of them: both restarts
# (about 8 s each) fall inside the sale.
STOCK, BUYERS, SPREAD_S = 300, 500, 45.0

# A loopback address outside the trusted proxies (127.0.0.1/32), for a buyer.
BUYER_ADDRESS = "127.0.0.3"

Topology = tuple[GatewayCluster, HAProxy]


@pytest.fixture(scope="module")
def topology(database_url: str) -> Iterator[Topology]:
    """Two gateways (lame duck on, our loopback trusted as proxy) and HAProxy over them."""
    cluster = GatewayCluster(
        2,
        redis_url=REDIS_URL,
        database_url=database_url,
        key_prefix=f"hap{uuid.uuid4().hex[:8]}",
        settings={"lame_duck_s": LAME_DUCK_S, "trusted_proxies": "127.0.0.1/32"},
    )
    proxy = HAProxy([f"{HOST}:{g.port}" for g in cluster])
    try:
        asyncio.run(cluster.start())
        asyncio.run(proxy.start())
        yield cluster, proxy
    finally:
        asyncio.run(proxy.close())
        asyncio.run(cluster.close())
        asyncio.run(_delete_keys(cluster.key_prefix))


async def _delete_keys(prefix: str) -> None:
    client = Redis.from_url(REDIS_URL)
    async for key in client.scan_iter(match=f"{prefix}*", count=1000):
        await client.delete(key)
    await client.aclose()


async def _sold(database_url: str, sku: str) -> int:
    """Units sold so far (one per order here)."""
    return (await db_state(database_url, sku))[1]


async def _rolling_restart(cluster: GatewayCluster, proxy: HAProxy) -> list[str]:
    """SIGTERM each gateway in turn, wait for it to leave, start it, wait for it to
    be back in rotation; what was seen, for the assertions."""
    seen = []
    for index, gateway in enumerate(cluster):
        name = f"gw{index + 1}"
        gateway.kill(signal.SIGTERM)
        await proxy.wait_state(name, "DOWN", within=LAME_DUCK_S + 5)
        # HAProxy learnt it from /readyz, while the gateway still listened.
        seen.append(f"{name} down while running={gateway.running}")
        assert await gateway.wait_exit(within=LAME_DUCK_S + SIGTERM_EXIT_S) == 0, cluster.logs()
        await gateway.start()
        await proxy.wait_state(name, "UP", within=15)
    return seen


async def _restart(gateway: Gateway, name: str, proxy: HAProxy, **settings: str | None) -> None:
    """Stop ``gateway`` gracefully, start it again with ``settings`` changed, and
    wait until HAProxy has it back in rotation."""
    gateway.kill(signal.SIGTERM)
    assert await gateway.wait_exit(within=LAME_DUCK_S + SIGTERM_EXIT_S) == 0, gateway.log_tail()
    gateway.configure(settings)
    await gateway.start()
    await proxy.wait_state(name, "UP", within=15)


def _bad_attempts(summary: DriverSummary) -> list[str]:
    """Attempts answered other than 201, 409 or 503-with-Retry-After."""
    return [
        f"{r.request_id}: {a.error or a.status} {a.body}"
        for r in summary.records
        for a in r.attempts
        if a.status not in (201, 409) and not (a.status == 503 and a.retry_after)
    ]


class TestRollingRestart:
    """Buyers through HAProxy never see a gateway go: lame duck, retries, request ids."""

    async def test_rolling_restart_mid_storm(self, topology: Topology, database_url: str) -> None:
        """500 buyers for 300 units arrive over 45 s through HAProxy, retrying with
        their request id; meanwhile each gateway in turn gets SIGTERM, leaves the
        rotation through its /readyz while still serving, exits 0, and comes back.
        Every buyer ends 201 or 409 sold out, every 503 carried Retry-After, exactly
        the stock is sold, and the audit is clean."""
        cluster, proxy = topology
        sku = f"sku-{cluster.key_prefix}"
        await cluster.put_sku(sku, STOCK)
        policy = ClientPolicy(max_attempts=100, budget_s=90.0, attempt_timeout_s=20.0)
        driver = LoadDriver(
            [proxy.url], sku, users=BUYERS, policy=policy, start_spread_s=SPREAD_S, seed=11
        )
        sale = asyncio.create_task(driver.run())
        await wait_for(lambda: _sold(database_url, sku), within=30, what="first orders")
        started = time.monotonic()
        seen = await _rolling_restart(cluster, proxy)
        sold_when_restarted = await _sold(database_url, sku)
        summary = await sale
        context = f"{summary.counts_text()} {summary.attempts_by()}\n{proxy.log_tail()}"
        assert seen == ["gw1 down while running=True", "gw2 down while running=True"]
        assert sold_when_restarted < STOCK, f"sold out before the restarts ended: {context}"
        assert _bad_attempts(summary) == [], context
        assert summary.counts == {"confirmed": STOCK, "sold_out": BUYERS - STOCK}, context
        report = await check_invariants(
            database_url, sku, STOCK, summary, scenario="haproxy", faults="rolling restart"
        )
        assert report.ok and report.sold == STOCK, f"{report}\n{cluster.logs()}"
        settings = Settings(
            redis_url=REDIS_URL, database_url=database_url, key_prefix=cluster.key_prefix
        )
        rows = await audit(settings, sku)
        assert [r.verdict for r in rows] == ["ok"], rows
        assert time.monotonic() - started < 60


class TestRetryOn503:
    """HAProxy resends a purchase a gateway refused with 503 to the other gateway
    (``retry-on ... 503`` with ``redispatch``): the buyer never sees the 503."""

    async def test_a_purchase_refused_with_503_ends_201_on_the_other_gateway(
        self, topology: Topology
    ) -> None:
        """gw1 alone is restarted with the admission secret (a rollout half done), so
        gw2, still up and ready, answers 503 to every purchase of a waiting-room sku.
        Four buyers admitted by gw1 buy through HAProxy one after the other: round
        robin sends some of them to gw2 first, and every one ends 201 (only gw1 can
        sell this sku) while HAProxy's counters show the retries and redispatches
        away from gw2's 503s. gw1 is restored without the secret afterwards."""
        cluster, proxy = topology
        gw1 = cluster[0]
        sku = f"room-{cluster.key_prefix}"
        room = {"admit_per_s": 100, "token_ttl_s": 60}
        await cluster.admin("PUT", f"/admin/skus/{sku}", {"stock": 10, "waiting_room": room})
        await _restart(gw1, "gw1", proxy, admission_secret=SECRET)
        try:
            before, refused_before = await proxy.stats(), await _unavailable(cluster[1].url)
            answers = []
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
                for n in range(4):
                    token = await _admitted(http, gw1.url, sku, f"buyer-{n}")
                    answers.append(await _buy(http, proxy.url, sku, f"buyer-{n}", token))
            after, refused = await proxy.stats(), await _unavailable(cluster[1].url)
        finally:
            await _restart(gw1, "gw1", proxy, admission_secret=None)
        counted = {
            f"{server}.{column}": int(after[server][column]) - int(before[server][column])
            for server in ("gw2", "BACKEND")
            for column in ("wretr", "wredis")
        }
        context = f"{answers} {counted}\n{proxy.log_tail()}\n{cluster.logs(8)}"
        assert [status for status, _ in answers] == [201] * 4, context
        assert refused - refused_before >= 1, f"gw2 answered no 503: {context}"
        assert min(counted.values()) >= 1, f"HAProxy counted no retry/redispatch: {context}"


async def _unavailable(url: str) -> float:
    """Purchases the gateway at ``url`` answered 503 ``unavailable`` so far."""
    found = await scrape(url)
    return sum(
        v
        for k, v in found.items()
        if k.startswith("flashsale_purchases") and 'outcome="unavailable"' in k
    )


async def _admitted(http: aiohttp.ClientSession, url: str, sku: str, user: str) -> str:
    """Join the sku's waiting room at ``url`` and poll until admitted; the token."""
    async with http.post(f"{url}/v1/queue/{sku}", json={"user_id": user}) as resp:
        assert resp.status == 200, await resp.text()
        ticket = (await resp.json())["ticket"]

    async def token() -> str | None:
        async with http.get(f"{url}/v1/queue/{sku}/{ticket}") as resp:
            body = await resp.json()
        return str(body["admission_token"]) if body.get("status") == "admitted" else None

    return await wait_for(token, within=10, what=f"{user} admitted")


async def _buy(
    http: aiohttp.ClientSession, url: str, sku: str, user: str, token: str
) -> tuple[int, object]:
    """A purchase with a request id (so HAProxy may resend it) and a token."""
    body = {"sku": sku, "user_id": user, "request_id": f"{sku}.{user}"}
    headers = {"Admission-Token": token}
    async with http.post(f"{url}/v1/purchase", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


class TestForwardedFor:
    """Behind HAProxy the client address is the one HAProxy saw, whatever the buyer
    writes in its own ``X-Forwarded-For``."""

    async def test_a_forged_header_does_not_escape_the_client_rate(
        self, topology: Topology
    ) -> None:
        """A sku allows one purchase per client address (a burst of 1, refilled
        every 100 s). Two buyers connect to HAProxy from 127.0.0.3 (not a trusted
        proxy; HAProxy itself reaches the gateways from 127.0.0.1, which is), each
        with a different made-up ``X-Forwarded-For``. HAProxy appends its own line
        naming 127.0.0.3, and the second buyer is refused 429: both were judged by
        the address HAProxy saw, not by the forged ones."""
        cluster, proxy = topology
        sku = f"xff-{cluster.key_prefix}"
        body = {"stock": 10, "per_user_limit": 1, "client_rate": "0.01/s:1"}
        await cluster.admin("PUT", f"/admin/skus/{sku}", body)
        statuses = []
        connector = aiohttp.TCPConnector(local_addr=(BUYER_ADDRESS, 0))
        async with aiohttp.ClientSession(connector=connector) as session:
            for n, forged in enumerate(["6.6.6.6", "7.7.7.7"]):
                async with session.post(
                    f"{proxy.url}/v1/purchase",
                    json={"sku": sku, "user_id": f"buyer-{n}"},
                    headers={"X-Forwarded-For": forged},
                ) as resp:
                    statuses.append((resp.status, (await resp.json()).get("error")))
        expected = [(201, None), (429, "rate_limited")]
        assert statuses == expected, f"{statuses}\n{cluster.logs(8)}"


def test_config_is_valid_for_compose_and_for_the_test() -> None:
    """``haproxy -c`` accepts deploy/haproxy.cfg with compose's defaults (names that
    do not resolve here only warn) and with loopback addresses."""
    compose = check_config({"PATH": "/usr/sbin:/usr/bin:/bin"})
    assert compose.returncode == 0, compose.stdout + compose.stderr
    native = check_config(
        {
            "PATH": "/usr/sbin:/usr/bin:/bin",
            "FRONTEND_ADDR": f"{HOST}:1",
            "INTERNAL_ADDR": f"{HOST}:5",
            "STATS_ADDR": f"{HOST}:2",
            "GW1_ADDR": f"{HOST}:3",
            "GW2_ADDR": f"{HOST}:4",
        }
    )
    assert native.returncode == 0, native.stdout + native.stderr
    assert "Warnings" not in native.stdout + native.stderr


# What the gateway answers for a route it does not have, and so what the public
# door answers for one it does not serve.
NO_SUCH_ROUTE = {"error": "not_found", "detail": "no such route"}


def _json_error(answer: Answer, status: int, error: str) -> str | None:
    """Why ``answer`` is not a JSON error ``status`` with code ``error`` and a
    detail, as the gateway's own error bodies are; None when it is."""
    if answer.status != status:
        return f"status {answer.status}, not {status}: {answer.body!r}"
    if answer.headers.get("content-type") != "application/json":
        return f"content-type {answer.headers.get('content-type')}: {answer.body!r}"
    body = answer.json()
    if body.get("error") != error or not body.get("detail"):
        return f"body {body}"
    return None


class TestPublicDoor:
    """The public frontend answers buyer routes only; the admin API, /metrics and
    /readyz are on the internal frontend."""

    async def test_admin_and_metrics_answer_only_on_the_internal_port(
        self, topology: Topology
    ) -> None:
        """With the admin token, GET /admin/skus/{sku}, POST /admin/reconcile,
        /metrics and /readyz through the public port are answered 404 exactly as
        an unknown route, and so are the same targets disguised: dot segments
        (plain and percent-encoded), a doubled slash, a percent-encoded letter,
        the absolute form. Buyer routes (/v1/skus/{sku}, /healthz) pass. The
        internal port serves the admin report, /metrics and /readyz."""
        cluster, proxy = topology
        sku = f"door-{cluster.key_prefix}"
        await cluster.admin("PUT", f"/admin/skus/{sku}", {"stock": 3})
        auth = f"Authorization: Bearer {cluster.admin_token}\r\n"
        targets = [
            f"/admin/skus/{sku}",
            "/metrics",
            "/readyz",
            f"/v1/../admin/skus/{sku}",
            "/v1/%2e%2e/metrics",
            "/wait/../metrics",
            f"//admin/skus/{sku}",
            f"/%61dmin/skus/{sku}",
            f"http://test/admin/skus/{sku}",
        ]
        public = {t: await exchange(proxy.port, get(t, auth)) for t in targets}
        reconcile = b"POST /admin/reconcile HTTP/1.1\r\nHost: test\r\n" + auth.encode()
        reconcile += b"Content-Length: 0\r\nConnection: close\r\n\r\n"
        public["POST /admin/reconcile"] = await exchange(proxy.port, reconcile)
        served = {t: _json_error(a, 404, "not_found") for t, a in public.items()}
        assert {t: why for t, why in served.items() if why} == {}, served
        assert [a.json() for a in public.values()] == [NO_SUCH_ROUTE] * len(public)
        buyer = [await exchange(proxy.port, get(t)) for t in (f"/v1/skus/{sku}", "/healthz")]
        assert [a.status for a in buyer] == [200, 200], buyer
        assert buyer[0].json()["available"] == 3
        internal = [
            await exchange(proxy.internal_port, get(t, auth))
            for t in (f"/admin/skus/{sku}", "/metrics", "/readyz")
        ]
        assert [a.status for a in internal] == [200, 200, 200], internal
        assert internal[0].json()["db_stock"] == 3
        assert b"flashsale_purchases_total" in internal[1].body


OLD_SERVER_TIMEOUT_S = 15.0


async def _long_poll(proxy: HAProxy, cluster: GatewayCluster) -> tuple[float, Answer]:
    """A purchase queued and not yet written (as the queue strategy leaves it
    after its 202), polled with ``?wait=25`` through the public port; a writer's
    verdict lands a second after the old 15 s server timeout. How long the poll
    took, and its answer."""
    sku, rid = f"poll-{cluster.key_prefix}", f"poll.{uuid.uuid4().hex[:12]}"
    settings = Settings(redis_url=REDIS_URL, key_prefix=cluster.key_prefix)
    redis = Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        await Streams(redis, settings).remember(rid, sku)
        started = time.monotonic()
        poll = asyncio.create_task(exchange(proxy.port, get(f"/v1/orders/{rid}?wait=25"), 40))
        # Held on purpose past the old limit: what is tested is a poll that
        # outlives it.
        await asyncio.sleep(OLD_SERVER_TIMEOUT_S + 1)
        assert not poll.done(), f"the poll ended early: {poll.result()}"
        await redis.hset(rejected_key(cluster.key_prefix, sku), rid, Verdict.SOLD_OUT.value)
        answer = await poll
        return time.monotonic() - started, answer
    finally:
        await redis.aclose()


async def _slow_client(proxy: HAProxy) -> bytes:
    """What a request head begun and never finished gets on the public port."""
    return await received(proxy.port, b"GET /v1/skus/x HTTP/1.1\r\nHost: test\r\n", 20)


class TestTimeoutsAndOwnErrors:
    """HAProxy waits out a long poll, and whatever it answers itself is JSON."""

    async def test_a_long_poll_outlives_the_storm_timeout_and_own_errors_are_json(
        self, topology: Topology
    ) -> None:
        """Four things at once, so the suite pays about 16 s for all of them:
        - GET /v1/orders/{id}?wait=25 through the public port is held past the
          old 15 s server timeout (which answered it 504 in HTML at 15.0 s) and
          gets its final answer, 409 sold_out, when the verdict lands at 16 s;
        - a request head left unfinished past ``timeout http-request`` is
          closed without a byte: HAProxy 2.6 can only send its HTML 408 there,
          or nothing (deploy/haproxy.cfg says why);
        - behind a second HAProxy from the same file, over an upstream that
          misbehaves, a request never answered ends 504 in JSON with
          Retry-After (any route but the long poll keeps 15 s), and an answer
          that is not HTTP gives 502 in JSON with Retry-After."""
        cluster, proxy = topology
        async with MisbehavingGateway() as upstream:
            async with HAProxy([upstream.address, upstream.address]) as broken:
                await broken.wait_state("gw1", "UP")
                polled, slow, stalled, junk = await asyncio.gather(
                    _long_poll(proxy, cluster),
                    _slow_client(proxy),
                    exchange(broken.port, get("/v1/stall"), 30),
                    exchange(broken.port, get("/v1/skus/x")),
                )
        took, answer = polled
        assert (answer.status, answer.json()) == (409, {"status": "sold_out"}), answer
        assert took > OLD_SERVER_TIMEOUT_S + 1, took
        assert slow == b"", slow
        for got, status, error in ((stalled, 504, "gateway_timeout"), (junk, 502, "bad_gateway")):
            assert _json_error(got, status, error) is None, _json_error(got, status, error)
            assert got.headers.get("retry-after") == "1", got

    async def test_a_malformed_request_is_closed_without_html(self, topology: Topology) -> None:
        """A header line without a colon is refused by HAProxy's own parser, which
        can only send its HTML 400 or nothing: the connection is closed without
        a byte, so no client ever parses an HTML page from us."""
        _, proxy = topology
        assert await received(proxy.port, get("/v1/skus/x", "Bad Header\r\n")) == b""

    async def test_no_gateway_up_is_503_in_json_with_retry_after(self) -> None:
        """HAProxy from the same file over two ports where nothing listens: once
        both are down, a buyer gets 503 in JSON with Retry-After, not HTML."""
        async with HAProxy([f"{HOST}:{free_port()}", f"{HOST}:{free_port()}"]) as alone:
            await alone.wait_state("gw1", "DOWN")
            await alone.wait_state("gw2", "DOWN")
            answer = await exchange(alone.port, get("/v1/skus/x"))
        assert _json_error(answer, 503, "unavailable") is None, answer
        assert answer.headers.get("retry-after") == "1", answer
