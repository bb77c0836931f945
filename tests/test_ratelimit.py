"""Per-key rpm and tpm: 429 with Retry-After and x-ratelimit-* headers, shared across processes through Redis."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from typing import Any

import openai
import pytest
from django.conf import settings

from accounts.key_cache import KeyInfo
from core import state
from proxy.ratelimit import rate_limit_admit
from tests.factories import make_account, make_key, make_model
from tests.servers import register_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]
HI: Any = [{"role": "user", "content": "hi [sim deltas=2]"}]


@pytest.fixture
def world(gateway_server, simulator):
    make_model(model_id="acme/model-1", max_output_tokens=100)
    account = make_account(name="limited", credits=10)
    register_worker(simulator.base_url)
    return {"account": account, "url": gateway_server.url}


def sdk(world, **key: Any) -> openai.OpenAI:
    secret = make_key(account=world["account"], **key).secret
    return openai.OpenAI(base_url=world["url"] + "/v1", api_key=secret, max_retries=0)


@pytest.fixture(params=["redis", "in-process"])
def backend(request, settings):
    if request.param == "in-process":
        settings.REDIS_URL = ""
    elif not settings.REDIS_URL:
        pytest.skip("REDIS_URL is not set")
    return request.param


def test_requests_per_minute(world, backend):
    ai = sdk(world, rpm=3)
    remaining = []
    for _ in range(3):
        raw = ai.chat.completions.with_raw_response.create(model="acme/model-1", messages=HI, max_tokens=2)
        assert raw.headers["x-ratelimit-limit-requests"] == "3"
        remaining.append(raw.headers["x-ratelimit-remaining-requests"])
    assert remaining == ["2", "1", "0"]
    with pytest.raises(openai.RateLimitError) as info:
        ai.chat.completions.create(model="acme/model-1", messages=HI, max_tokens=2)
    assert info.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
    # One request comes back every 20 s at 3 per minute.
    assert 1 <= int(info.value.response.headers["retry-after"]) <= 20


def test_tokens_per_minute_count_actual_usage(world, backend):
    ai = sdk(world, tpm=230)
    # Each request is admitted on its bound: prompt bound (the SDK's 99-byte body + 16 + 16) plus max_tokens
    # 50 = 181; then the unused part comes back ("hi [sim deltas=2]" uses 3 + 2 tokens), so five fit in 230.
    for _ in range(5):
        raw = ai.chat.completions.with_raw_response.create(model="acme/model-1", messages=HI, max_tokens=50)
        assert raw.headers["x-ratelimit-limit-tokens"] == "230"
    # A request that really uses 52 tokens (admitted on its bound of 179) leaves too little for another 181.
    ai.chat.completions.create(
        model="acme/model-1", messages=[{"role": "user", "content": "[sim deltas=50]"}], max_tokens=50
    )
    with pytest.raises(openai.RateLimitError) as info:
        ai.chat.completions.create(model="acme/model-1", messages=HI, max_tokens=50)
    assert int(info.value.response.headers["retry-after"]) >= 1
    assert int(info.value.response.headers["x-ratelimit-remaining-tokens"]) < 181


def test_a_key_without_limits_is_never_limited_and_gets_no_rate_limit_headers(world, backend):
    limited, unlimited = sdk(world, rpm=1), sdk(world)
    limited.chat.completions.create(model="acme/model-1", messages=HI, max_tokens=2)
    with pytest.raises(openai.RateLimitError):  # the limiter is on: a limited key is held here
        limited.chat.completions.create(model="acme/model-1", messages=HI, max_tokens=2)
    for _ in range(5):
        raw = unlimited.chat.completions.with_raw_response.create(model="acme/model-1", messages=HI, max_tokens=2)
        assert raw.http_response.status_code == 200
        assert not [h for h in raw.headers if h.startswith("x-ratelimit-") or h.startswith("retry-after")]


def _key(world: dict[str, Any], *, rpm: int | None = None, tpm: int | None = None) -> KeyInfo:
    return KeyInfo(
        id=1,
        account_id=1,
        account_name="x",
        name="x",
        prefix="x",
        digest=make_key(account=world["account"]).api_key.digest,
        scopes=frozenset(),
        allowed_models=frozenset(),
        rpm=rpm,
        tpm=tpm,
        expires_at=None,
        revoked=False,
    )


@pytest.mark.skipif(not settings.REDIS_URL, reason="REDIS_URL is not set")
def test_a_new_loop_that_reuses_a_closed_loops_id_gets_its_own_redis_client(world):
    """A process runs loop after loop (workers, tests): a later loop often gets a closed one's id(), and
    must not be handed the Redis client bound to that closed loop (it fails with 'Event loop is closed')."""
    key = _key(world, rpm=4)
    first = asyncio.new_event_loop()
    assert first.run_until_complete(rate_limit_admit(key=key, tokens=1)).allowed
    first_id, first_ref = id(first), weakref.ref(first)
    first.close()
    del first
    # The next loop's client replaces it: the closed loop and its client are not kept for ever.
    asyncio.run(rate_limit_admit(key=key, tokens=1))
    gc.collect()
    assert first_ref() is None, "the limiter keeps a closed loop (and its Redis client) alive"
    for _ in range(1000):
        loop = asyncio.new_event_loop()
        if id(loop) == first_id:
            break
        loop.close()
    else:
        pytest.skip("no new loop reused the closed loop's id")
    try:
        decisions = [loop.run_until_complete(rate_limit_admit(key=key, tokens=1)) for _ in range(3)]
    finally:
        loop.close()
    # The bucket is Redis's, shared by every loop: 4 per minute, two taken on the earlier loops.
    assert [d.allowed for d in decisions] == [True, True, False]
    assert decisions[1].remaining_requests == 0
    assert decisions[2].retry_after_ms > 0


def test_a_process_state_reset_refills_this_process_buckets(world, settings):
    settings.REDIS_URL = ""
    key = _key(world, rpm=1)
    assert asyncio.run(rate_limit_admit(key=key, tokens=1)).allowed
    assert not asyncio.run(rate_limit_admit(key=key, tokens=1)).allowed
    state.reset()
    assert asyncio.run(rate_limit_admit(key=key, tokens=1)).allowed


@pytest.mark.skipif(not settings.REDIS_URL, reason="REDIS_URL is not set")
def test_the_limit_holds_across_event_loops_and_threads(world):
    """Two gateway processes look like two threads with their own loops and Redis connections here."""
    key = _key(world, rpm=10)
    admitted: list[bool] = []

    def hammer() -> None:
        async def run() -> list[bool]:
            return [(await rate_limit_admit(key=key, tokens=1)).allowed for _ in range(15)]

        admitted.extend(asyncio.run(run()))

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert admitted.count(True) == 10


@pytest.mark.skipif(not settings.REDIS_URL, reason="REDIS_URL is not set")
def test_a_burst_past_the_redis_pool_is_still_limited_exactly_in_redis(world, caplog):
    """300 admits at once on one loop (more than the Redis client's 100 connections): they queue for a
    connection instead of reading as a Redis outage, so the shared limit still counts every one."""
    key = _key(world, rpm=250)

    async def burst() -> list[bool]:
        decisions = await asyncio.gather(*(rate_limit_admit(key=key, tokens=1) for _ in range(300)))
        return [d.allowed for d in decisions]

    admitted = asyncio.run(burst())
    assert admitted.count(True) == 250
    assert "Redis is unreachable" not in caplog.text


@pytest.mark.skipif(not settings.REDIS_URL, reason="REDIS_URL is not set")
def test_the_unused_bound_rides_on_the_next_admit_or_lands_on_its_own_soon(world):
    """A request's unused token bound goes back with the key's next admit (no round trip of its own), and
    when no request follows it is sent within REFUND_FLUSH_S; either way the bucket ends up counting only
    what was used."""
    import redis

    from proxy import ratelimit

    key = _key(world, tpm=1000)
    bucket = redis.Redis.from_url(settings.REDIS_URL)
    tokens_left = lambda: float(bucket.hget(ratelimit._bucket_names(key)[1], "l") or 0)  # noqa: E731

    async def run() -> tuple[float, float, float]:
        assert (await rate_limit_admit(key=key, tokens=400)).allowed
        ratelimit.rate_limit_refund_soon(key=key, tokens=390)  # used 10 of its 400
        queued = tokens_left()  # nothing sent yet: the bucket still holds the whole bound
        assert (await rate_limit_admit(key=key, tokens=400)).allowed  # carries the 390 back
        folded = tokens_left()
        ratelimit.rate_limit_refund_soon(key=key, tokens=395)
        await asyncio.sleep(ratelimit.REFUND_FLUSH_S + 0.2)  # no admit follows: flushed on its own
        return queued, folded, tokens_left()

    queued, folded, flushed = asyncio.run(run())
    assert 599 <= queued <= 601  # 1000 - 400 (plus a refill of a fraction of a token)
    assert 589 <= folded <= 592  # 1000 - 400 + 390 - 400
    assert 984 <= flushed <= 987  # 1000 - 10 - 5
