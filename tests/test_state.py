"""core.state: one reset returns every piece of process state to its start; config objects follow settings."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from django.core.exceptions import ImproperlyConfigured

from accounts import key_cache
from accounts.key_cache import KeyInfo
from core import state
from runtimes.config import RuntimeConfig, get_runtime_config
from runtimes.http import worker_timeout
from workers import balancer, fleet
from workers.config import get_routing_config


def _info() -> KeyInfo:
    return KeyInfo(
        id=7,
        account_id=1,
        account_name="a",
        name="k",
        prefix="p",
        digest="d" * 64,
        scopes=frozenset(),
        allowed_models=frozenset(),
        rpm=None,
        tpm=None,
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
        revoked=False,
    )


def test_a_reset_forgets_what_the_process_learned():
    key_cache.put(_info())
    balancer.observe("w1", 0.2)
    fleet.acquire("w1")
    assert key_cache.get("d" * 64) is not None and balancer.view() and fleet.view() == {"w1": 1}
    state.reset()
    assert key_cache.get("d" * 64) is None
    assert balancer.view() == {}
    assert fleet.view() == {}
    assert {"accounts.key_cache", "catalog.cache", "workers.routing", "proxy.ratelimit.local"} <= set(
        state.registered()
    )


def test_loop_local_keeps_one_value_per_loop_and_closes_it_on_reset():
    closed: list[str] = []

    async def close(value: str) -> None:
        closed.append(value)

    local: state.LoopLocal[str] = state.LoopLocal("tests.loop_local", close=close)
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        local.set("first", first)
        local.set("second", second)
        assert (local.get(first), local.get(second)) == ("first", "second")
        first.close()  # a closed loop's value is dropped: nothing can run there
        state.reset()
        assert closed == ["second"]
        assert local.get(second) is None
    finally:
        second.close()


def test_a_changed_setting_reaches_the_runtime_config(settings):
    assert worker_timeout({}).read == 120.0
    settings.SPEEDINFER_UPSTREAM_READ_TIMEOUT = 7.0
    assert get_runtime_config().read_timeout == 7.0
    assert worker_timeout({}).read == 7.0
    assert worker_timeout({"read_timeout": 3}).read == 3.0


def test_bad_values_are_improperly_configured(settings):
    with pytest.raises(ImproperlyConfigured, match="connect_timeout"):
        RuntimeConfig(connect_timeout=0, read_timeout=1, total_timeout=1)
    settings.SPEEDINFER_ROUTING_POLICY = "fastest"
    with pytest.raises(ImproperlyConfigured, match="SPEEDINFER_ROUTING_POLICY"):
        get_routing_config()
