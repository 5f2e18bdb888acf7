"""The queue strategy's settings and script: parsed from the environment, bounded,
and enqueue.lua composed with reserve.lua's whole body."""

from __future__ import annotations

import pytest

from gateway.domain.model import Strategy
from gateway.redis.scripts import read_composed, read_script
from gateway.settings import SettingsError, load


def test_strategy_defaults_to_reserve_batch_and_reads_queue() -> None:
    """GATEWAY_STRATEGY is reserve-batch unless set; "queue" selects the queue."""
    assert load({}).strategy is Strategy.RESERVE_BATCH
    settings = load({"GATEWAY_STRATEGY": "queue", "GATEWAY_QUEUE_WRITER": "false"})
    assert settings.strategy is Strategy.QUEUE
    assert settings.queue_writer is False


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"GATEWAY_STRATEGY": "fifo"}, "GATEWAY_STRATEGY"),
        ({"GATEWAY_WRITER_BLOCK_MS": "5000"}, "GATEWAY_WRITER_BLOCK_MS"),
        ({"GATEWAY_WRITER_BLOCK_MS": "0"}, "GATEWAY_WRITER_BLOCK_MS"),
        ({"GATEWAY_WRITER_CLAIM_IDLE_S": "0"}, "GATEWAY_WRITER_CLAIM_IDLE_S"),
        ({"GATEWAY_STREAM_MAX": "0"}, "GATEWAY_STREAM_MAX"),
    ],
)
def test_bad_queue_values_name_the_setting(env: dict[str, str], named: str) -> None:
    """A bad value is refused with one line naming the setting; a writer's block
    must stay under the Redis client's 5 s socket timeout."""
    with pytest.raises(SettingsError) as info:
        load(env)
    assert str(info.value).startswith(named)


def test_a_strategy_error_lists_the_strategies() -> None:
    """The refusal says which strategies there are."""
    with pytest.raises(SettingsError) as info:
        load({"GATEWAY_STRATEGY": "fifo"})
    assert all(s.value in str(info.value) for s in Strategy)


def test_enqueue_runs_reserve_whole() -> None:
    """enqueue.lua is preceded by reserve.lua, unchanged, as a local function, so
    the reservation's checks live in one file."""
    reserve, enqueue = read_script("reserve"), read_composed("enqueue", "reserve")
    assert enqueue.source.startswith("local function reserve()\n" + reserve.source)
    assert enqueue.sha != reserve.sha
