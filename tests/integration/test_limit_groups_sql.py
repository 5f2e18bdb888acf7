"""A limit group on the strategies that decide in PostgreSQL alone (issue 41),
tested the way a bot would buy: one purchase to every size at once. A file of
its own, so that ``make test``'s two workers run these storms beside
test_limit_groups.py's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.domain.model import Strategy
from testkit.limit_groups import bot_storm
from testkit.purchases import Client


@pytest.mark.parametrize("strategy", [s for s in Strategy if not s.reserves])
async def test_a_bot_buying_every_size_gets_one_pair(
    start_gateway: Callable[..., Awaitable[Client]],
    database_url: str,
    make_settings: Any,
    strategy: Strategy,
) -> None:
    """A group of 5 skus of 40 units, limit 1; 400 buyers each send one
    purchase to every sku at once (2,000 requests): no buyer ends with more
    than one unit across the group, exactly 200 units are sold (nothing lost
    to a refusal that should not have been: the trigger's rollback returns the
    stock its refusal took), and the audit is clean."""
    await bot_storm(start_gateway, database_url, make_settings(), strategy)
