"""Locust scenarios against a running gateway.

Pick a scenario by user class (``loadtests/lib/profiles.py`` lists them) or by tag::

    python -m locust -f loadtests/lib/locustfile.py --host http://127.0.0.1:8080 \\
        --headless -u 200 -r 200 -t 30s FlashCrowdUser

Classes and tags: ``FlashCrowdUser`` (flash_crowd), ``SoldOutStormUser``
(sold_out_storm), ``DuplicateClickerUser`` (duplicate_clickers),
``RestockBuyerUser`` + ``RestockAdminUser`` (restock_mid_sale) and
``MixedBrowseUser`` (mixed_browse_buy), ``WaitingRoomUser`` (waiting_room: the
waiting-room page's calls at its pace: the page, the sku, a join, polls
``poll_after_s`` apart, the purchase with the admission token; the gateway
needs ``GATEWAY_ADMISSION_SECRET``).

On test start the master (or the only process) creates the skus through the
admin API with ``GATEWAY_ADMIN_TOKEN``; ``LOCUST_SETUP=0`` skips that (skus
made some other way). A response counts as a failure when it is a 5xx, an
unexpected status, or breaks a sale rule (a unit sold of a sku with no stock,
two orders for one request id). This file imports nothing from the repository,
so it can be shipped alone to Locust workers on other machines.
"""

from __future__ import annotations

import json
import logging
import os
import random
import urllib.error
import urllib.request
import uuid
from typing import Any

from gevent.pool import Group
from locust import FastHttpUser, between, constant, events, tag, task
from locust.contrib.fasthttp import ResponseContextManager
from locust.env import Environment
from locust.runners import WorkerRunner

log = logging.getLogger("locustfile")

ADMIN_TOKEN = os.environ.get("GATEWAY_ADMIN_TOKEN")
SKU_PREFIX = os.environ.get("LOCUST_SKU_PREFIX", "locust")
FLASH_SKU = f"{SKU_PREFIX}-flash"
SOLD_OUT_SKU = f"{SKU_PREFIX}-soldout"
DUPLICATE_SKU = f"{SKU_PREFIX}-dupes"
RESTOCK_SKU = f"{SKU_PREFIX}-restock"
BROWSE_SKU = f"{SKU_PREFIX}-browse"
ROOM_SKU = f"{SKU_PREFIX}-room"
STOCKS = {
    FLASH_SKU: int(os.environ.get("LOCUST_FLASH_STOCK", "5000")),
    SOLD_OUT_SKU: 0,
    DUPLICATE_SKU: 10_000_000,
    RESTOCK_SKU: int(os.environ.get("LOCUST_RESTOCK_STOCK", "20")),
    BROWSE_SKU: 10_000_000,
    ROOM_SKU: int(os.environ.get("LOCUST_ROOM_STOCK", "1000")),
}
# Skus sold through a waiting room, and its settings.
ROOMS = {
    ROOM_SKU: {
        "admit_per_s": int(os.environ.get("LOCUST_ROOM_ADMIT_PER_S", "200")),
        "token_ttl_s": 60,
    }
}
RESTOCK_EVERY_S = float(os.environ.get("LOCUST_RESTOCK_EVERY", "1.0"))
RESTOCK_DELTA = int(os.environ.get("LOCUST_RESTOCK_DELTA", "10"))
CLICKS = 5
JSON_HEADERS = {"Content-Type": "application/json"}


def new_id() -> str:
    """A fresh user or request id (unique across workers without coordination)."""
    return uuid.uuid4().hex


@events.test_start.add_listener  # type: ignore[untyped-decorator]
def create_skus(environment: Environment, **_: Any) -> None:
    """Create or reset every scenario's sku through the admin API, once per test."""
    if isinstance(environment.runner, WorkerRunner) or os.environ.get("LOCUST_SETUP") == "0":
        return
    if not ADMIN_TOKEN:
        log.warning("GATEWAY_ADMIN_TOKEN is not set: assuming the skus exist")
        return
    # urllib would honour http_proxy from the environment; talk to the host directly.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for sku, stock in STOCKS.items():
        sku_body: dict[str, Any] = {"stock": stock, "per_user_limit": 1}
        if sku in ROOMS:
            sku_body["waiting_room"] = ROOMS[sku]
        body = json.dumps(sku_body).encode()
        request = urllib.request.Request(
            f"{environment.host}/admin/skus/{sku}", data=body, method="PUT"
        )
        request.add_header("Authorization", f"Bearer {ADMIN_TOKEN}")
        request.add_header("Content-Type", "application/json")
        try:
            with opener.open(request, timeout=10) as response:
                response.read()
        except (urllib.error.URLError, OSError) as exc:
            log.error("cannot create sku %s: %s", sku, exc)
            if environment.runner is not None:
                environment.runner.quit()
            return


def _body(response: ResponseContextManager) -> dict[str, Any]:
    try:
        data = json.loads(response.text or "null")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def judge(
    response: ResponseContextManager, allowed: frozenset[tuple[int, str | None]]
) -> dict[str, Any]:
    """Mark the response a success only if its (status, body status) is allowed.

    ``None`` as body status allows any body. 5xx are always failures, named so.
    """
    status = response.status_code
    body = _body(response)
    if status >= 500 or status == 0:
        response.failure(f"HTTP {status} server error: {(response.text or '')[:120]}")  # type: ignore[no-untyped-call]
    elif (status, body.get("status")) in allowed or (status, None) in allowed:
        response.success()  # type: ignore[no-untyped-call]
    else:
        reason = body.get("status") or body.get("error")
        response.failure(f"unexpected HTTP {status} {reason}")  # type: ignore[no-untyped-call]
    return body


BUY_OUTCOMES = frozenset({(201, "confirmed"), (409, "sold_out")})


class Shopper(FastHttpUser):
    """A buyer; subclasses say which sku and how often."""

    abstract = True

    def buy(
        self,
        sku: str,
        name: str,
        allowed: frozenset[tuple[int, str | None]] = BUY_OUTCOMES,
        user_id: str | None = None,
        request_id: str | None = None,
        admission_token: str | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """POST /v1/purchase, one unit; returns (status, body)."""
        body = {
            "sku": sku,
            "user_id": user_id or new_id(),
            "request_id": request_id or new_id(),
        }
        headers = JSON_HEADERS
        if admission_token is not None:
            headers = {**JSON_HEADERS, "Admission-Token": admission_token}
        with self.client.post(
            "/v1/purchase",
            data=json.dumps(body),
            headers=headers,
            name=name,
            catch_response=True,
        ) as response:
            return response.status_code, judge(response, allowed)


class FlashCrowdUser(Shopper):
    """A crowd of new shoppers on one sku: 201 until it sells out, then 409."""

    wait_time = between(0.0, 0.05)

    @tag("flash_crowd")
    @task
    def purchase(self) -> None:
        """One new shopper buys one unit."""
        self.buy(FLASH_SKU, "purchase [flash_crowd]")


class SoldOutStormUser(Shopper):
    """Buyers of a sku with no stock: every answer must be 409 sold_out."""

    wait_time = between(0.0, 0.02)

    @tag("sold_out_storm")
    @task
    def purchase(self) -> None:
        """One attempt on the sold-out sku; a 201 here is an oversell."""
        self.buy(SOLD_OUT_SKU, "purchase [sold_out_storm]", frozenset({(409, "sold_out")}))


class DuplicateClickerUser(Shopper):
    """An impatient shopper: one request id sent 5 times at once, then looked up."""

    wait_time = between(0.0, 0.1)
    # All clicks of one shopper in flight together (FastHttpSession's limit).
    concurrency = CLICKS

    @tag("duplicate_clickers")
    @task
    def click_five_times(self) -> None:
        """Five concurrent identical purchases: at most one order, and it is found."""
        user_id, request_id = new_id(), new_id()
        replies: list[tuple[int, dict[str, Any]]] = []
        allowed = frozenset({(201, "confirmed"), (409, "in_progress")})

        def click() -> None:
            replies.append(
                self.buy(
                    DUPLICATE_SKU, "purchase [duplicate_clickers]", allowed, user_id, request_id
                )
            )

        group = Group()
        for _ in range(CLICKS):
            group.spawn(click)
        group.join(timeout=self.network_timeout)
        orders = {body.get("order_id") for status, body in replies if status == 201}
        self._check_order(request_id, user_id, orders)

    def _check_order(self, request_id: str, user_id: str, orders: set[Any]) -> None:
        with self.client.get(
            f"/v1/orders/{request_id}?user_id={user_id}",
            name="order [duplicate_clickers]",
            catch_response=True,
        ) as response:
            body = judge(response, frozenset({(200, None)}))
            if len(orders) > 1:
                response.failure(
                    f"one request id, {len(orders)} orders: {sorted(map(str, orders))}"
                )
            elif orders and body.get("order_id") not in orders:
                response.failure("the stored order is not the one confirmed")


class RestockBuyerUser(Shopper):
    """Buyers of a small stock that an admin keeps restocking."""

    wait_time = between(0.0, 0.05)

    @tag("restock_mid_sale")
    @task
    def purchase(self) -> None:
        """One new shopper buys one unit: 201 while stock lasts, then 409 until restocked."""
        self.buy(RESTOCK_SKU, "purchase [restock_mid_sale]")


class RestockAdminUser(FastHttpUser):
    """The one admin adding stock while the sale runs."""

    fixed_count = 1
    wait_time = constant(RESTOCK_EVERY_S)

    @tag("restock_mid_sale")
    @task
    def restock(self) -> None:
        """POST /admin/skus/{sku}/restock with the admin token."""
        with self.client.post(
            f"/admin/skus/{RESTOCK_SKU}/restock",
            data=json.dumps({"delta": RESTOCK_DELTA}),
            headers={**JSON_HEADERS, "Authorization": f"Bearer {ADMIN_TOKEN}"},
            name="restock [restock_mid_sale]",
            catch_response=True,
        ) as response:
            judge(response, frozenset({(200, None)}))


class MixedBrowseUser(Shopper):
    """Shoppers who look at the sku five times for every purchase."""

    wait_time = between(0.05, 0.2)

    @tag("mixed_browse_buy")
    @task(5)
    def browse(self) -> None:
        """GET /v1/skus/{sku}: what is left."""
        with self.client.get(
            f"/v1/skus/{BROWSE_SKU}", name="sku [mixed_browse_buy]", catch_response=True
        ) as response:
            judge(response, frozenset({(200, None)}))

    @tag("mixed_browse_buy")
    @task(1)
    def purchase(self) -> None:
        """One new shopper buys one unit."""
        self.buy(BROWSE_SKU, "purchase [mixed_browse_buy]")


class WaitingRoomUser(Shopper):
    """A shopper on the waiting-room page, making its calls at its pace: the page
    (``GET /wait/{sku}``), the sku, a join, polls ``poll_after_s`` apart (a
    tenth more at random), ``Retry-After`` (half more at random) after a 429 or
    503, then the purchase with the admission token and a request id of its own.
    Then a new shopper takes their place; sold out ends a shopper's wait."""

    user_id = ""
    ticket: str | None = None
    pause_s = 0.0

    def wait_time(self) -> float:
        """The page's own pause before its next call."""
        return self.pause_s

    def on_start(self) -> None:
        """Start as a new shopper."""
        self._next_shopper()

    def _next_shopper(self) -> None:
        self.user_id, self.ticket, self.pause_s = new_id(), None, random.uniform(0.1, 0.3)

    @tag("waiting_room")
    @task
    def step(self) -> None:
        """Open the page and join if not yet in line, else poll, and buy once admitted."""
        if self.ticket is None:
            self._open_page()
            return
        with self.client.get(
            f"/v1/queue/{ROOM_SKU}/{self.ticket}", name="poll [waiting_room]", catch_response=True
        ) as response:
            body = judge(response, frozenset({(200, None)}))
            self._pace(response, body)
        if body.get("status") == "admitted":
            token = str(body["admission_token"])
            name = "purchase [waiting_room]"
            self.buy(ROOM_SKU, name, user_id=self.user_id, admission_token=token)
            self._next_shopper()
        elif body.get("status") == "sold_out":
            self._next_shopper()

    def _open_page(self) -> None:
        """What a page load asks for: the document, the sku, a place in line."""
        with self.client.get(
            f"/wait/{ROOM_SKU}?user_id={self.user_id}",
            name="page [waiting_room]",
            catch_response=True,
        ) as response:
            judge(response, frozenset({(200, None)}))
        with self.client.get(
            f"/v1/skus/{ROOM_SKU}", name="sku [waiting_room]", catch_response=True
        ) as response:
            judge(response, frozenset({(200, None)}))
        with self.client.post(
            f"/v1/queue/{ROOM_SKU}",
            data=json.dumps({"user_id": self.user_id}),
            headers=JSON_HEADERS,
            name="join [waiting_room]",
            catch_response=True,
        ) as response:
            body = judge(response, frozenset({(200, None), (409, "sold_out")}))
            self._pace(response, body)
        self.ticket = body.get("ticket")
        if self.ticket is None:
            self._next_shopper()

    def _pace(self, response: ResponseContextManager, body: dict[str, Any]) -> None:
        """When the page would call again: as the API asks, never sooner."""
        headers = response.headers
        retry_after = None if headers is None else headers.get("Retry-After")
        if response.status_code in (429, 503) and isinstance(retry_after, str):
            self.pause_s = float(retry_after) * random.uniform(1.0, 1.5)
        elif body.get("position") == 0:
            self.pause_s = 0.0
        else:
            self.pause_s = float(body.get("poll_after_s", 1)) * random.uniform(1.0, 1.1)
