"""A driver error inside ``as_unavailable`` leaves it as a 503; ours pass unchanged."""

from __future__ import annotations

import asyncpg
import pytest

from gateway.domain.errors import InvalidRequest, PostgresUnavailable
from gateway.postgres.database import as_unavailable


@pytest.mark.parametrize(
    "raised",
    [
        asyncpg.PostgresConnectionError(),
        asyncpg.InterfaceError("closed"),
        OSError(),
        TimeoutError(),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_a_driver_error_becomes_postgres_unavailable(raised: Exception) -> None:
    """The 503 names the driver error and keeps it as its cause."""
    expected = pytest.raises(PostgresUnavailable, match=type(raised).__name__)
    with expected as caught, as_unavailable:
        raise raised
    assert caught.value.__cause__ is raised


def test_a_domain_error_passes_unchanged() -> None:
    """An adapter's own refusal inside the block is what the caller sees."""
    with pytest.raises(InvalidRequest), as_unavailable:
        raise InvalidRequest("ends_at must be after starts_at")


def test_nothing_raised_is_nothing_raised() -> None:
    """The block's value comes out, however many times the one instance is entered."""
    for _ in range(2):
        with as_unavailable:
            value = 1
        assert value == 1
