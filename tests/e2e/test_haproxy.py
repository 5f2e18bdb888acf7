"""Behind a real HAProxy (deploy/haproxy.cfg): a rolling restart in the middle of
a storm, retries of a 503, the client address (test_haproxy_door.py has the
public door, the long poll and HAProxy's own answers).

HAProxy and two gateway processes start once for the module, on the shared
Redis and the session's database, under a key prefix of their own.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import Iterator

import aiohttp
import pytest

from gateway.ops.audit import audit
from gateway.settings import Settings
from testkit.driver import ClientPolicy, DriverSummary, LoadDriver
from testkit.gateways import SIGTERM_EXIT_S, Gateway, GatewayCluster
from testkit.haproxy import HAProxy, behind_haproxy, check_config
from testkit.invariants import check_invariants
from testkit.metrics import scrape
from testkit.polling import wait_for
from testkit.ports import HOST
from testkit.purchases import db_state
from testkit.rooms import SECRET
from testkit.services import REDIS_URL

# Longer than HAProxy needs to take a gateway out (fall 2, inter 1s).
LAME_DUCK_S = 3
# Buyers arrive for 45 s and the stock lasts about 27 s of them: both restarts
# (about 8 s each) fall inside the sale. Once both are done, the buyers not yet
# arrived come at once (the driver's hurry): the sale ends with the restarts,
# not 45 s after its start.
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
    with behind_haproxy(cluster) as proxy:
        yield cluster, proxy


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
        rotation through its /readyz while still serving, exits 0, and comes back
        (then the buyers yet to arrive come at once).
        Every buyer ends 201 or 409 sold out, every 503 carried Retry-After, exactly
        the stock is sold, and the audit is clean."""
        cluster, proxy = topology
        sku = f"sku-{cluster.key_prefix}"
        await cluster.put_sku(sku, STOCK)
        policy = ClientPolicy(max_attempts=100, budget_s=90.0, attempt_timeout_s=20.0)
        restarted = asyncio.Event()
        driver = LoadDriver(
            [proxy.url],
            sku,
            users=BUYERS,
            policy=policy,
            start_spread_s=SPREAD_S,
            seed=11,
            hurry=restarted,
        )
        sale = asyncio.create_task(driver.run())
        await wait_for(lambda: _sold(database_url, sku), within=30, what="first orders")
        seen = await _rolling_restart(cluster, proxy)
        sold_when_restarted = await _sold(database_url, sku)
        restarted.set()
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


class TestRetryOn503:
    """HAProxy resends a purchase a gateway refused with 503 to the other gateway
    (``retry-on ... 503`` with ``redispatch``): the buyer never sees the 503."""

    async def test_a_purchase_refused_with_503_ends_201_on_the_other_gateway(
        self, topology: Topology
    ) -> None:
        """gw1 alone is restarted with the admission secret (a rollout half done), so
        gw2, still up and ready, answers 503 to every purchase of a waiting-room sku.
        Four buyers admitted by gw1 buy through HAProxy one after the other: the
        sku's purchases are routed to gw2 first, and every one ends 201 (only gw1 can
        sell this sku) while HAProxy's counters show the retries and redispatches
        away from gw2's 503s. gw1 is restored without the secret afterwards."""
        cluster, proxy = topology
        gw1 = cluster[0]
        # A sku HAProxy routes to gw2, so each purchase meets gw2's 503 first.
        sku = await _routed_to(proxy, "gw2", f"room-{cluster.key_prefix}")
        room = {"admit_per_s": 100, "token_ttl_s": 60}
        await _restart(gw1, "gw1", proxy, admission_secret=SECRET)
        try:
            # Through gw1: an instance without the secret refuses to configure a room.
            await cluster.admin("PUT", f"/admin/skus/{sku}", {"stock": 10, "waiting_room": room})
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


class TestRoutingBySku:
    """HAProxy sends a sku's purchases to one gateway (consistent hashing on the
    body's ``sku``), so one hot sku's batches form in one process."""

    async def test_a_skus_purchases_all_reach_one_gateway(self, topology: Topology) -> None:
        """Twelve buyers of one sku through HAProxy: every purchase is answered by
        the same gateway (HAProxy's per-server counters), and a second sku routed
        to the other gateway is answered there, so both gateways take their share
        of the skus."""
        cluster, proxy = topology
        skus = {
            server: await _routed_to(proxy, server, f"hot-{server}-{cluster.key_prefix}")
            for server in ("gw1", "gw2")
        }
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
            for server, sku in skus.items():
                await cluster.put_sku(sku, 100)
                before = await _answered(proxy)
                for n in range(12):
                    body = {"sku": sku, "user_id": f"u{n}", "request_id": f"{sku}.{n}"}
                    async with http.post(f"{proxy.url}/v1/purchase", json=body) as resp:
                        assert resp.status == 201, await resp.text()
                after = await _answered(proxy)
                grew = {name: after[name] - before[name] for name in after}
                other = "gw1" if server == "gw2" else "gw2"
                assert grew == {server: 12, other: 0}, (sku, grew, proxy.log_tail())


async def _answered(proxy: HAProxy) -> dict[str, int]:
    """Requests each gateway answered so far, by HAProxy's count (``req_tot``)."""
    stats = await proxy.stats()
    return {name: int(stats[name]["req_tot"] or 0) for name in ("gw1", "gw2")}


async def _routed_to(proxy: HAProxy, server: str, stem: str) -> str:
    """A sku name (``stem`` plus a number) whose purchases HAProxy routes to
    ``server``: each candidate is probed with one purchase of an unknown sku
    (answered 404 by whichever gateway gets it, changing nothing)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for n in range(64):
            sku = f"{stem}-{n}"
            before = await _answered(proxy)
            body = {"sku": sku, "user_id": "probe", "request_id": f"probe.{sku}"}
            async with http.post(f"{proxy.url}/v1/purchase", json=body) as resp:
                assert resp.status == 404, await resp.text()
            after = await _answered(proxy)
            if after[server] > before[server]:
                return sku
    raise AssertionError(f"no sku of 64 routed to {server}")


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
