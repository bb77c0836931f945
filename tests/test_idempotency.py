"""Idempotency-Key (docs/interface.md, HTTP): a retried request is answered again, never run or charged twice."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import httpx
import openai
import pytest
from django.utils import timezone

from accounts.models import Account
from billing.models import IdempotencyKey, UsageRecord
from billing.services import credits_grant
from core.credits import MICRO
from tests.factories import make_account, make_key

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]


@pytest.fixture
def world(make_world):
    return make_world(account="retrier", model={"input_price": MICRO, "output_price": MICRO})


def post(world: dict[str, Any], key: str | None, content: str = "hello", *, secret: str = "", **body: Any):
    headers = {"Authorization": f"Bearer {secret or world['secret']}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    payload = {"model": "acme/model-1", "messages": [{"role": "user", "content": content}], **body}
    return httpx.post(world["url"] + "/v1/chat/completions", json=payload, headers=headers, timeout=20)


def worker_calls(world) -> int:
    return len(world["simulator"].simulator.stats.requests)


def charged(world) -> int:
    return 10 * MICRO - Account.objects.get(pk=world["account"].pk).available


@pytest.mark.parametrize("bad", ["", "x" * 256, "caf\u00e9", "tab\there"])
def test_a_malformed_key_is_a_400_and_nothing_runs(world, bad):
    calls = worker_calls(world)
    raw = [(b"authorization", f"Bearer {world['secret']}".encode()), (b"idempotency-key", bad.encode())]
    response = httpx.post(
        world["url"] + "/v1/chat/completions",
        content=b'{"model": "acme/model-1", "messages": [{"role": "user", "content": "hi"}]}',
        headers=raw,
        timeout=10,
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_request"
    assert "Idempotency-Key" in response.json()["error"]["message"]
    assert worker_calls(world) == calls and charged(world) == 0


def test_a_repeat_is_replayed_without_a_worker_call_or_a_second_charge(world):
    first = post(world, "order-1")
    assert first.status_code == 200 and "idempotent-replayed" not in first.headers
    calls, cost = worker_calls(world), charged(world)
    assert cost > 0
    again = post(world, "order-1")
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert worker_calls(world) == calls and charged(world) == cost
    assert UsageRecord.objects.filter(account=world["account"]).count() == 1
    # 255 printable characters is still a key; without a key every request runs.
    assert post(world, "k" * 255).status_code == 200
    assert post(world, None).status_code == 200 and worker_calls(world) == calls + 2


def test_a_streamed_answer_is_replayed_as_the_same_stream(world):
    first = post(world, "stream-1", stream=True)
    assert first.status_code == 200 and first.text.endswith("data: [DONE]\n\n")
    calls, cost = worker_calls(world), charged(world)
    again = post(world, "stream-1", stream=True)
    assert again.headers["content-type"].startswith("text/event-stream")
    assert again.headers["idempotent-replayed"] == "true"
    assert again.text == first.text
    assert worker_calls(world) == calls and charged(world) == cost


def test_the_same_key_with_another_body_is_a_422(world):
    assert post(world, "order-2", "hello").status_code == 200
    calls, cost = worker_calls(world), charged(world)
    response = post(world, "order-2", "something else")
    assert response.status_code == 422 and response.json()["error"]["code"] == "idempotency_key_reused"
    assert worker_calls(world) == calls and charged(world) == cost


def test_two_identical_requests_at_once_run_once_and_the_other_gets_409(world):
    calls = worker_calls(world)
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: post(world, "race-1", "slow [sim latency=1000]"), range(2)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200, 409], statuses
    busy = next(a for a in answers if a.status_code == 409)
    assert busy.json()["error"]["code"] == "idempotency_key_in_progress"
    assert worker_calls(world) == calls + 1
    assert UsageRecord.objects.filter(account=world["account"]).count() == 1
    # Once the first has finished, a repeat gets its answer.
    assert post(world, "race-1", "slow [sim latency=1000]").headers["idempotent-replayed"] == "true"
    assert worker_calls(world) == calls + 1


def test_a_first_attempt_that_charged_nothing_is_not_remembered(world):
    poor = make_account(name="poor", credits=0)
    secret = make_key(account=poor).secret
    refused = post(world, "order-3", secret=secret)
    assert refused.status_code == 402
    assert not IdempotencyKey.objects.filter(key="order-3").exists()
    credits_grant(account=poor, amount=MICRO, actor="staff")
    retried = post(world, "order-3", secret=secret)
    assert retried.status_code == 200 and "idempotent-replayed" not in retried.headers
    # An upstream failure (502, nothing charged) is not remembered either.
    failed = post(world, "order-4", "boom [sim status=500]")
    assert failed.status_code == 502
    assert not IdempotencyKey.objects.filter(key="order-4").exists()


def test_keys_are_scoped_to_the_api_key_and_last_24_hours(world):
    other = make_key(account=world["account"]).secret
    assert post(world, "shared").status_code == 200
    calls = worker_calls(world)
    answer = post(world, "shared", secret=other)
    assert answer.status_code == 200 and "idempotent-replayed" not in answer.headers
    assert worker_calls(world) == calls + 1
    IdempotencyKey.objects.filter(key="shared").update(created_at=timezone.now() - timedelta(hours=25))
    answer = post(world, "shared")
    assert answer.status_code == 200 and "idempotent-replayed" not in answer.headers
    assert worker_calls(world) == calls + 2


def test_the_openai_sdk_sends_it_with_extra_headers(world):
    ai = openai.OpenAI(base_url=world["url"] + "/v1", api_key=world["secret"], max_retries=2)
    first = ai.chat.completions.create(
        model="acme/model-1",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"Idempotency-Key": "sdk-1"},
    )
    cost = charged(world)
    raw = ai.chat.completions.with_raw_response.create(
        model="acme/model-1",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"Idempotency-Key": "sdk-1"},
    )
    assert raw.headers["idempotent-replayed"] == "true"
    assert raw.parse().choices[0].message.content == first.choices[0].message.content
    assert charged(world) == cost
