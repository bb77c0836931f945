"""The whole request is paid for, whatever it carries (docs/interface.md, Round 3): the prompt bound from
the forwarded body, media at the model's allowance, every choice reserved, batched and token-id prompts,
a settle capped at the key's budget, cached-token pricing; against a vLLM-like worker (tests/vllm_like.py)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest
from django.db import connection

from billing.models import KeySpend, Reservation, UsageRecord
from billing.pricing import PER_MESSAGE_TOKEN_ALLOWANCE, PER_REQUEST_TOKEN_ALLOWANCE, cost_of
from billing.services import credits_reserve, reservation_settle
from core.credits import MICRO
from tests.factories import make_account, make_key, make_model, money
from tests.servers import register_worker

pytestmark = pytest.mark.sqlite  # money moves: every test runs on the embedded default's SQLite too
MAX_OUT = 64


def customer(gateway_server: Any, *, credits: int = 10, budget: int | None = None, **model: Any) -> dict[str, Any]:
    make_model(model_id="acme/model-1", max_output_tokens=MAX_OUT, **model)
    account = make_account(name="vllm-customer", credits=credits)
    key = make_key(account=account, monthly_budget=budget)
    return {"account": account, "key": key.api_key, "secret": key.secret, "url": gateway_server.url}


def post(world: dict[str, Any], path: str, payload: dict[str, Any]) -> tuple[httpx.Response, bytes]:
    raw = orjson.dumps(payload)
    response = httpx.post(
        world["url"] + path,
        content=raw,
        headers={"Authorization": f"Bearer {world['secret']}", "Content-Type": "application/json"},
        timeout=30,
    )
    return response, raw


def chat_bound(raw: bytes, *, messages: int = 1, minus: int = 0, plus: int = 0) -> int:
    return len(raw) - minus + plus + messages * PER_MESSAGE_TOKEN_ALLOWANCE + PER_REQUEST_TOKEN_ALLOWANCE


def reserved_cost(prompt: int, completion: int) -> int:
    return cost_of(prompt_tokens=prompt, completion_tokens=completion, input_price=MICRO, output_price=2 * MICRO)


def nothing_held(world: dict[str, Any], credits: int = 10) -> None:
    assert money(world["account"]) == (credits * MICRO, 0)
    assert not Reservation.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_gateway")
class TestThroughTheGateway:
    def test_a_120_kb_pass_through_field_is_reserved_and_the_budget_holds(self, gateway_server, vllm_worker):
        worker, thread = vllm_worker
        world = customer(gateway_server, budget=200_000)  # 0.2 credits a month
        register_worker(thread.base_url, worker_id="vllm-1")
        documents = [{"title": f"doc {i}", "text": "lorem ipsum dolor sit amet " * 40} for i in range(110)]
        payload = {"model": "acme/model-1", "messages": [{"role": "user", "content": "sum up"}], "documents": documents}
        response, raw = post(world, "/v1/chat/completions", payload)
        assert len(raw) > 120_000
        assert response.status_code == 200, response.text
        assert worker.bodies[-1]["documents"] == documents  # forwarded as sent
        record = UsageRecord.objects.get()
        # The worker billed every byte of the documents (its tokenizer's worst case: one token a byte).
        assert record.prompt_tokens == worker.count_prompt(worker.bodies[-1]) > 110_000
        assert record.reserved == reserved_cost(chat_bound(raw), MAX_OUT)
        assert record.cost == reserved_cost(record.prompt_tokens, 5) <= record.reserved
        assert (record.overrun, record.uncharged) == (0, 0)
        assert money(world["account"]) == (10 * MICRO - record.cost, 0)
        assert KeySpend.objects.get(api_key=world["key"]).spent == record.cost <= 200_000

        # A second one no longer fits what is left of the budget: refused before the worker is called.
        response, _ = post(world, "/v1/chat/completions", payload)
        assert (response.status_code, response.json()["error"]["code"]) == (402, "key_budget_exceeded")
        assert len(worker.bodies) == 1 and KeySpend.objects.get(api_key=world["key"]).spent <= 200_000

    def test_n_3_is_reserved_for_three_choices(self, gateway_server, vllm_worker):
        worker, thread = vllm_worker
        world = customer(gateway_server)
        register_worker(thread.base_url, worker_id="vllm-1")
        payload = {"model": "acme/model-1", "messages": [{"role": "user", "content": "three ways"}], "n": 3}
        response, raw = post(world, "/v1/chat/completions", payload)
        assert response.status_code == 200 and len(response.json()["choices"]) == 3
        record = UsageRecord.objects.get()
        assert record.reserved == reserved_cost(chat_bound(raw), 3 * MAX_OUT)
        assert record.completion_tokens == 15 and record.cost == reserved_cost(record.prompt_tokens, 15)
        assert money(world["account"]) == (10 * MICRO - record.cost, 0)

    def test_batched_and_token_id_prompts(self, gateway_server, vllm_worker):
        worker, thread = vllm_worker
        world = customer(gateway_server)
        register_worker(thread.base_url, worker_id="vllm-1")
        texts = ["one two", "three four", "five"]
        response, raw = post(world, "/v1/completions", {"model": "acme/model-1", "prompt": texts})
        assert response.status_code == 200 and len(response.json()["choices"]) == 3
        first = UsageRecord.objects.get()
        extra = 2 * PER_REQUEST_TOKEN_ALLOWANCE  # the two further prompts' own sequences
        assert first.reserved == reserved_cost(chat_bound(raw, messages=0, plus=extra), 3 * MAX_OUT)

        ids = [[101, 2023, 2003], [101, 7592]]
        response, raw = post(world, "/v1/completions", {"model": "acme/model-1", "prompt": ids, "max_tokens": 8})
        assert response.status_code == 200, response.text
        second = UsageRecord.objects.latest("id")
        assert second.prompt_tokens == 5  # the worker counted the ids
        # A token id counts one token: the ids' JSON is taken off the body's bytes, their count added.
        bound = chat_bound(raw, messages=0, minus=sum(len(orjson.dumps(i)) for i in ids), plus=5 + extra // 2)
        assert second.reserved == reserved_cost(bound, 2 * 8)
        assert money(world["account"]) == (10 * MICRO - first.cost - second.cost, 0)

    def test_media_is_reserved_at_the_models_allowance(self, gateway_server, vllm_worker):
        worker, thread = vllm_worker
        world = customer(gateway_server, media_tokens=500)
        register_worker(thread.base_url, worker_id="vllm-1")
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 60_000}}
        content = [{"type": "text", "text": "what is this?"}, image]
        payload = {"model": "acme/model-1", "messages": [{"role": "user", "content": content}]}
        response, raw = post(world, "/v1/chat/completions", payload)
        assert response.status_code == 200, response.text
        assert worker.bodies[-1]["messages"][0]["content"][1] == image  # forwarded unchanged
        record = UsageRecord.objects.get()
        # Not by its 60 KB of base64: the part's JSON is taken off, the allowance added.
        assert record.reserved == reserved_cost(chat_bound(raw, minus=len(orjson.dumps(image)), plus=500), MAX_OUT)
        assert record.prompt_tokens == worker.count_prompt(worker.bodies[-1]) and record.cost <= record.reserved
        assert money(world["account"]) == (10 * MICRO - record.cost, 0)

    def test_bad_input_is_a_400_naming_the_field_and_holds_nothing(self, gateway_server, vllm_worker):
        worker, thread = vllm_worker
        world = customer(gateway_server)  # no media allowance
        register_worker(thread.base_url, worker_id="vllm-1")
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        hello = [{"role": "user", "content": "hi"}]
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": [image]}]}, "messages[0].content[0]"),
            ("/v1/chat/completions", {"messages": hello, "n": 17}, "n"),
            ("/v1/completions", {"prompt": "hi", "n": 3, "best_of": 2}, "best_of"),
            ("/v1/completions", {"prompt": ["p"] * 129}, "prompt"),
            ("/v1/completions", {"prompt": [1, 2.5]}, "prompt[1]"),
            ("/v1/completions", {"prompt": [[1], [2, "x"]]}, "prompt[1][1]"),
            ("/v1/embeddings", {"input": [image]}, "input[0]"),
            ("/v1/embeddings", {"input": [3, -1]}, "input[1]"),
        ]
        for path, body, param in cases:
            response, _ = post(world, path, {"model": "acme/model-1", **body})
            assert response.status_code == 400, (body, response.text)
            assert response.json()["error"]["code"] == "invalid_request"
            assert response.json()["error"]["param"] == param, body
        assert worker.bodies == []
        nothing_held(world)

    def test_an_overrun_on_a_budgeted_key_is_charged_up_to_the_budget(self, gateway_server, vllm_worker):
        worker, thread = vllm_worker
        world = customer(gateway_server, budget=2000)  # 0.002 credits a month
        register_worker(thread.base_url, worker_id="vllm-1")
        worker.prompt_tokens = 15_000  # a runtime billing far past the bound (a chat template, say)
        payload = {"model": "acme/model-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        response, _ = post(world, "/v1/chat/completions", payload)
        assert response.status_code == 200
        assert response.json()["usage"]["prompt_tokens"] == 15_000  # the worker's word reaches the client
        record = UsageRecord.objects.get()
        assert record.reserved < 2000 and (record.cost, record.uncharged) == (2000, 15_010 - 2000)
        assert KeySpend.objects.get(api_key=world["key"]).spent == 2000  # never above the budget
        assert money(world["account"]) == (10 * MICRO - 2000, 0)
        response, _ = post(world, "/v1/chat/completions", payload)
        assert (response.status_code, response.json()["error"]["code"]) == (402, "key_budget_exceeded")

    def test_cached_and_reasoning_tokens_are_recorded_and_priced(self, gateway_server, vllm_worker):
        worker, thread = vllm_worker
        world = customer(gateway_server, cached_input_price=MICRO // 10)
        register_worker(thread.base_url, worker_id="vllm-1")
        worker.prompt_tokens, worker.cached_tokens, worker.reasoning_tokens = 1000, 800, 3
        payload = {"model": "acme/model-1", "messages": [{"role": "user", "content": "again"}]}
        response, _ = post(world, "/v1/chat/completions", payload)
        usage = response.json()["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 800}  # unchanged
        assert usage["completion_tokens_details"] == {"reasoning_tokens": 3}
        record = UsageRecord.objects.get()
        # (1000 - 800) x 1 + 800 x 0.1 + 5 x 2 credits per 1M tokens = 200 + 80 + 10 micro-credits.
        assert (record.cached_tokens, record.reasoning_tokens, record.cost) == (800, 3, 290)
        assert money(world["account"]) == (10 * MICRO - 290, 0)
        listed = httpx.get(world["url"] + "/v1/usage", headers={"Authorization": f"Bearer {world['secret']}"})
        item = listed.json()["data"][0]
        assert (item["cached_tokens"], item["reasoning_tokens"], item["cost"]) == (800, 3, "0.000290")
        models = httpx.get(world["url"] + "/v1/models", headers={"Authorization": f"Bearer {world['secret']}"})
        assert models.json()["data"][0]["pricing"] == {
            "input": "1.000000",
            "output": "2.000000",
            "cached_input": "0.100000",
        }


@pytest.mark.django_db(transaction=True)
def test_concurrent_overruns_on_one_key_never_pass_its_budget():
    account = make_account(credits=10)
    key = make_key(account=account, monthly_budget=10_000).api_key
    model = make_model()
    holds = [
        credits_reserve(account_id=account.pk, amount=1000, model=model, api_key_id=key.pk, budget=10_000)
        for _ in range(8)
    ]
    barrier = threading.Barrier(len(holds))

    def settle(reservation_id: Any) -> int:
        try:
            barrier.wait(10)
            record = reservation_settle(reservation_id=reservation_id, prompt_tokens=5000, completion_tokens=0)
            return record.cost if record else -1
        finally:
            connection.close()

    with ThreadPoolExecutor(len(holds)) as pool:
        costs = list(pool.map(settle, [h.pk for h in holds]))
    # Each cost 5000 against a 1000 hold: together they are charged exactly the budget, never more.
    assert sum(costs) == 10_000 and all(c >= 1000 for c in costs)
    spend = KeySpend.objects.get(api_key=key)
    assert (spend.spent, spend.reserved) == (10_000, 0)
    assert sum(UsageRecord.objects.values_list("uncharged", flat=True)) == 8 * 5000 - 10_000
    assert money(account) == (10 * MICRO - 10_000, 0)


@pytest.mark.django_db
class TestTheLedger:
    def test_an_overrun_is_charged_up_to_the_budget_and_the_rest_is_uncharged(self):
        account = make_account(credits=10)
        key = make_key(account=account, monthly_budget=5000).api_key
        model = make_model()
        other = credits_reserve(account_id=account.pk, amount=1000, model=model, api_key_id=key.pk, budget=5000)
        held = credits_reserve(account_id=account.pk, amount=1000, model=model, api_key_id=key.pk, budget=5000)
        # Costs 20000 micro-credits against a 1000 hold: charged what is left of the budget beside the
        # other running hold (5000 - 1000), never more; the rest recorded as uncharged.
        record = reservation_settle(reservation_id=held.pk, prompt_tokens=20_000, completion_tokens=0)
        assert record is not None
        assert (record.cost, record.overrun, record.uncharged) == (4000, 19_000, 16_000)
        assert money(account) == (10 * MICRO - 4000 - 1000, 1000)
        # The other hold can still be charged in full, and the month ends at the budget exactly.
        second = reservation_settle(reservation_id=other.pk, prompt_tokens=3000, completion_tokens=0)
        assert second is not None and (second.cost, second.uncharged) == (1000, 2000)
        spend = KeySpend.objects.get(api_key=key)
        assert (spend.spent, spend.reserved) == (5000, 0)
        assert money(account) == (10 * MICRO - 5000, 0)

    def test_cached_and_reasoning_tokens_are_recorded_and_priced_by_the_formula(self):
        account = make_account(credits=10)
        model = make_model(model_id="acme/cached", cached_input_price=MICRO // 4)
        held = credits_reserve(account_id=account.pk, amount=10_000, model=model)
        record = reservation_settle(
            reservation_id=held.pk, prompt_tokens=1000, completion_tokens=101, cached_tokens=600, reasoning_tokens=40
        )
        assert record is not None
        # (1000 - 600) x 1 + 600 x 0.25 + 101 x 2 credits per 1M tokens = 400 + 150 + 202 micro-credits.
        assert record.cost == 752
        stored = UsageRecord.objects.get()
        assert (stored.cached_tokens, stored.reasoning_tokens, stored.cost) == (600, 40, 752)
        assert money(account) == (10 * MICRO - 752, 0)
        # Without a cached price, cached tokens cost the input price.
        plain = make_model(model_id="acme/plain")
        held = credits_reserve(account_id=account.pk, amount=10_000, model=plain)
        record = reservation_settle(reservation_id=held.pk, prompt_tokens=1000, completion_tokens=0, cached_tokens=600)
        assert record is not None and record.cost == 1000
