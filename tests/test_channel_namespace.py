"""Two deployments sharing one Redis database: each one's dashboards get only its own usage messages."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

pytestmark = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="the Redis channel layer (full profile)")

ROOT = Path(__file__).resolve().parent.parent


def layer_config_of(database_url: str) -> dict[str, object]:
    """CHANNEL_LAYERS["default"]["CONFIG"] of a deployment on `database_url` and this test's Redis."""
    code = (
        "import django, json, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'speedinfer.settings'); "
        "django.setup(); from django.conf import settings; "
        "config = settings.CHANNEL_LAYERS['default']['CONFIG']; "
        "print(json.dumps({'prefix': config['prefix'], 'hosts': config['hosts']}))"
    )
    env = {**os.environ, "DATABASE_URL": database_url}
    out = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=60
    )
    import json

    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_usage_pushed_by_one_deployment_never_reaches_the_others_dashboards():
    from channels_redis.core import RedisChannelLayer

    base = os.environ["DATABASE_URL"].rsplit("/", 1)[0]
    a, b = layer_config_of(f"{base}/deployment_a"), layer_config_of(f"{base}/deployment_b")
    assert a["prefix"] != b["prefix"]
    assert settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] != "asgi"  # not channels_redis's shared default

    async def scenario() -> tuple[dict[str, object] | None, dict[str, object] | None]:
        layer_a = RedisChannelLayer(hosts=a["hosts"], prefix=a["prefix"])
        layer_b = RedisChannelLayer(hosts=b["hosts"], prefix=b["prefix"])
        try:
            # The same account number's dashboard is open on both (ids are per database, so they collide).
            group = "usage.account.1"
            dashboard_a, dashboard_b = await layer_a.new_channel(), await layer_b.new_channel()
            await layer_a.group_add(group, dashboard_a)
            await layer_b.group_add(group, dashboard_b)
            await layer_a.group_send(group, {"type": "usage.update", "request_id": "from-a"})

            async def receive(layer: RedisChannelLayer, channel: str) -> dict[str, object] | None:
                try:
                    return dict(await asyncio.wait_for(layer.receive(channel), 1.0))
                except TimeoutError:
                    return None

            got_a = await receive(layer_a, dashboard_a)
            got_b = await receive(layer_b, dashboard_b)
            await layer_a.group_discard(group, dashboard_a)
            await layer_b.group_discard(group, dashboard_b)
            return got_a, got_b
        finally:
            await layer_a.flush()
            await layer_b.flush()

    got_a, got_b = asyncio.run(scenario())
    assert got_a is not None and got_a["request_id"] == "from-a"
    assert got_b is None
