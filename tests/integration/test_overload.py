"""Overload logging: a storm of 503s writes one sampled line and a summary, not a line each."""

from __future__ import annotations

from typing import Any

from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from gateway.http.appkeys import ANSWERS, BATCHER
from testkit.purchases import put_sku


class TestOverloadLogging:
    """Shed and refused purchases are counted; their lines are sampled, at most one a second."""

    async def test_a_storm_of_503s_logs_one_line_and_a_summary(
        self, start_gateway: Any, sku: str
    ) -> None:
        """Fifty purchases refused 503 while draining, and five answered sold out, in
        well under a second: one ``request_failed`` line (the first, with its request
        id), and a summary counting the 50 503s, the 49 lines left out and the 5
        sold-out answers."""
        client = await start_gateway()
        gone = f"{sku}-gone"
        await put_sku(client, sku, 10)
        await put_sku(client, gone, 0)
        answers = client.app[ANSWERS]
        answers.summary()  # start counting from here
        for i in range(5):
            resp = await client.post("/v1/purchase", json={"sku": gone, "user_id": f"s{i}"})
            assert resp.status == 409
        await client.app[BATCHER].close()
        with capture_logs(processors=[merge_contextvars]) as logs:
            for i in range(50):
                resp = await client.post(
                    "/v1/purchase",
                    json={"sku": sku, "user_id": f"u{i}", "request_id": f"{sku}.o-{i}"},
                )
                assert resp.status == 503
                assert (await resp.json())["error"] == "unavailable"
        failures = [e for e in logs if e["event"] == "request_failed"]
        assert len(failures) == 1, failures
        assert failures[0]["request_id"] == f"{sku}.o-0"
        summary = answers.summary()
        assert summary is not None
        assert (summary["unavailable"], summary["failures_not_logged"]) == (50, 49)
        assert summary["sold_out"] == 5
        assert answers.summary() is None

    async def test_sheds_are_counted(self, start_gateway: Any, sku: str) -> None:
        """With the queue bound at 0 every purchase is shed with 503 before Redis is
        asked; the summary counts them as sheds."""
        client = await start_gateway(backlog_max=0)
        await put_sku(client, sku, 10)
        answers = client.app[ANSWERS]
        answers.summary()
        for i in range(3):
            resp = await client.post("/v1/purchase", json={"sku": sku, "user_id": f"u{i}"})
            assert resp.status == 503
        summary = answers.summary()
        assert summary is not None
        assert (summary["shed"], summary["unavailable"]) == (3, 3)
