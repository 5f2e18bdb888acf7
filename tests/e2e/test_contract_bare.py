"""Schemathesis against a gateway with no optional setting: tests/e2e/contract.py says how."""

from __future__ import annotations

import pytest

from tests.e2e.contract import BARE_BUDGET_S, BARE_SKUS, FIXED_SEED, fuzz


async def test_schemathesis_finds_nothing_without_optional_settings(
    run_id: str, request: pytest.FixtureRequest
) -> None:
    """Every phase and check of schemathesis, with the fixed seed, against a
    gateway that sets no optional setting but the admin token: no admission
    secret, no default rate. Its answers to what it cannot serve (a waiting
    room on PUT or PATCH: 422 not_configured) are in the contract as well."""
    seeds = ((FIXED_SEED, "fixed, no optional setting"),)
    name = f"flashsale_contract_bare_{run_id}"
    await fuzz(request, name, {}, BARE_SKUS, seeds, BARE_BUDGET_S)
