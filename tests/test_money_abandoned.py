"""Requests a client abandons or retries are paid for exactly (docs/interface.md, Round 3: "The whole
request is paid for, whatever it carries"): reasoning deltas count on a disconnect, a non-streaming
answer the client left before is cancelled upstream and free, and the openai SDK's retries of one
failing request count once against the worker's circuit. Against a vLLM-like worker (tests/vllm_worker.py).

Prices: 1 micro-credit per prompt token, 2 per completion token, so each cost is checked to the micro-credit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from billing.models import Reservation, UsageRecord
from tests.factories import make_account, make_key, make_model, money
from tests.servers import register_worker
from tests.vllm_worker import VllmWorker
from workers.models import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway"), pytest.mark.sqlite]


@pytest.fixture
def vllm() -> Iterator[VllmWorker]:
    worker = VllmWorker().start()
    yield worker
    worker.stop()


@pytest.fixture
def world(gateway_server: Any, vllm: VllmWorker) -> dict[str, Any]:
    make_model(model_id="acme/model-1", max_output_tokens=512)
    account = make_account(name="reasoner", credits=10)
    return {"account": account, "secret": make_key(account=account).secret, "url": gateway_server.url, "vllm": vllm}


def _sdk(world: dict[str, Any], **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=world["url"] + "/v1", api_key=world["secret"], **options)


def _closed(count: int, timeout: float = 10) -> list[Reservation]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reservations = list(Reservation.objects.all())
        if len(reservations) == count and all(r.status != "held" for r in reservations):
            return reservations
        time.sleep(0.05)
    raise AssertionError(f"expected {count} closed reservations, found {list(Reservation.objects.values('status'))}")


def _eventually(check: Any, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_client_leaving_after_150_reasoning_deltas_pays_for_them(world, field):
    register_worker(world["vllm"].base_url)
    before = money(world["account"])
    text = f"think it over [vllm reasoning=300 content=2 delay=20 field={field}]"
    seen = 0
    with httpx.stream(
        "POST",
        world["url"] + "/v1/chat/completions",
        json={"model": "acme/model-1", "stream": True, "messages": [{"role": "user", "content": text}]},
        headers={"Authorization": f"Bearer {world['secret']}"},
        timeout=10,
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and orjson.loads(line[6:])["choices"][0]["delta"].get(field):
                seen += 1
                if seen == 150:
                    break
    (reservation,) = _closed(1)
    assert reservation.status == "settled"
    record = UsageRecord.objects.get()
    assert record.status == "client_disconnected"
    # Every reasoning delta sent is a completion token: the 150 read, and the few sent before the
    # gateway noticed (it used to charge 0 for reasoning deltas).
    assert 150 <= record.completion_tokens <= 165, record.completion_tokens
    assert record.prompt_tokens == -(-len(text.encode()) // 4)  # prompt bytes / 4, rounded up
    assert record.cost == record.prompt_tokens * 1 + record.completion_tokens * 2
    assert money(world["account"]) == (before[0] - record.cost, 0)
    _eventually(lambda: world["vllm"].stats.cancelled == 1)  # the worker was told to stop


def test_sdk_timeout_and_retries_against_a_slow_answer_charge_nothing_and_cancel_upstream(world):
    register_worker(world["vllm"].base_url)
    before = money(world["account"])
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        _sdk(world, timeout=1.0, max_retries=2).chat.completions.create(
            model="acme/model-1", messages=[{"role": "user", "content": "take your time [vllm latency=2500]"}]
        )
    print(f"SDK gave up after {time.monotonic() - started:.1f} s and 3 attempts")
    reservations = _closed(3)
    assert {r.status for r in reservations} == {"released"}
    records = list(UsageRecord.objects.all())
    disconnected = ("client_disconnected", "client_disconnected", 0)
    assert [(r.status, r.error_code, r.cost) for r in records] == [disconnected] * 3
    assert money(world["account"]) == before  # three attempts, no answer: nothing charged
    _eventually(lambda: world["vllm"].stats.cancelled == 3)  # each attempt was cancelled at the worker
    assert world["vllm"].stats.finished == 0


def test_sdk_retry_after_a_timeout_pays_once_for_the_answer_it_received(world):
    register_worker(world["vllm"].base_url)
    vllm = world["vllm"]
    vllm.slow_next, vllm.slow_ms = 1, 2500  # the first attempt outlasts the client's timeout; the retry does not
    before = money(world["account"])
    answer = _sdk(world, timeout=1.0, max_retries=2).chat.completions.create(
        model="acme/model-1", messages=[{"role": "user", "content": "hello there [vllm content=5]"}]
    )
    assert answer.usage is not None
    reservations = _closed(2)
    assert sorted(r.status for r in reservations) == ["released", "settled"]
    charged = UsageRecord.objects.get(status="ok")
    assert UsageRecord.objects.get(status="client_disconnected").cost == 0
    assert (charged.prompt_tokens, charged.completion_tokens) == (answer.usage.prompt_tokens, 5)
    assert charged.cost == charged.prompt_tokens + 2 * 5
    assert money(world["account"]) == (before[0] - charged.cost, 0)
    _eventually(lambda: vllm.stats.cancelled == 1)


def test_sdk_retries_of_a_failing_request_count_once_and_other_clients_are_still_served(world):
    register_worker(world["vllm"].base_url)
    before = money(world["account"])
    with pytest.raises(openai.InternalServerError):
        _sdk(world, max_retries=2).chat.completions.create(
            model="acme/model-1", messages=[{"role": "user", "content": "break [vllm status=500]"}]
        )
    assert world["vllm"].stats.statuses.count(500) == 3  # the SDK tried three times
    worker = Worker.objects.get()
    assert (worker.circuit_state, worker.consecutive_failures) == ("closed", 1)  # it used to open at 3
    assert money(world["account"]) == before
    assert [r.cost for r in UsageRecord.objects.all()] == [0, 0, 0]

    other = make_account(name="bystander", credits=10)
    other_before = money(other)
    answer = openai.OpenAI(
        base_url=world["url"] + "/v1", api_key=make_key(account=other).secret, max_retries=0
    ).chat.completions.create(model="acme/model-1", messages=[{"role": "user", "content": "hi [vllm content=3]"}])
    assert answer.usage is not None and answer.usage.completion_tokens == 3
    record = UsageRecord.objects.get(account=other)
    assert record.cost == answer.usage.prompt_tokens + 2 * 3
    assert money(other) == (other_before[0] - record.cost, 0)


def test_an_answer_past_the_read_timeout_is_not_retried_and_counts_once(world):
    register_worker(world["vllm"].base_url, read_timeout=0.5)
    vllm = world["vllm"]
    before = money(world["account"])
    messages: list[Any] = [{"role": "user", "content": "a long essay [vllm latency=1500]"}]
    body = {"model": "acme/model-1", "messages": messages}
    with pytest.raises(openai.APIStatusError) as failure:
        _sdk(world, max_retries=2).chat.completions.create(model="acme/model-1", messages=messages)
    assert failure.value.status_code == 504
    assert failure.value.response.headers["x-should-retry"] == "false"
    assert vllm.stats.requests == 1  # the SDK honoured it: the worker did the long work once, not three times
    for _ in range(2):  # a client retrying by hand anyway
        response = httpx.post(
            world["url"] + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {world['secret']}"},
            timeout=10,
        )
        assert response.status_code == 504
    worker = Worker.objects.get()
    assert (worker.circuit_state, worker.consecutive_failures) == ("closed", 1)
    assert money(world["account"]) == before
    _closed(3)
    answer = _sdk(world, max_retries=0).chat.completions.create(
        model="acme/model-1", messages=[{"role": "user", "content": "short [vllm content=2]"}]
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 2
