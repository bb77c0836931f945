"""One test per row of docs/interface.md's error table: the status, the code, and nothing charged or left held."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import openai
import pytest
from django.utils import timezone

from accounts.models import Account, ApiKey
from accounts.services import api_key_revoke
from billing.models import Reservation, UsageRecord
from tests.factories import make_account, make_key, make_model
from tests.fixtures import sdk
from tests.servers import register_worker
from workers.models import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]
HELLO: Any = [{"role": "user", "content": "hello"}]


def refused(world, call: Callable[[], Any], status: int, code: str) -> openai.APIStatusError:
    """Run `call`, expect the error, and check the account's money did not move."""
    account = Account.objects.get(pk=world["account"].pk)
    with pytest.raises(openai.APIStatusError) as info:
        call()
    error = info.value
    assert error.status_code == status
    body = error.body
    assert isinstance(body, dict)  # the SDK unwraps {"error": {...}}
    assert body["code"] == code
    assert set(body) == {"message", "type", "code", "param"}
    after = Account.objects.get(pk=account.pk)
    assert (after.available, after.reserved) == (account.available, account.reserved)
    assert not Reservation.objects.filter(status="held").exists()
    assert error.response.headers["x-request-id"]
    return error


def embed(world, **kwargs: Any) -> Callable[[], Any]:
    def call() -> Any:
        return sdk(world).embeddings.create(model="acme/model-1", **kwargs)

    return call


def chat(world, secret: str | None = None, **kwargs: Any) -> Callable[[], Any]:
    def call() -> Any:
        params = {"model": "acme/model-1", "messages": HELLO, **kwargs}
        return sdk(world, secret=secret).chat.completions.create(**params)

    return call


def test_400_invalid_request_names_the_field(world):
    error = refused(world, chat(world, temperature=7), 400, "invalid_request")
    assert error.body["param"] == "temperature"  # type: ignore[index]
    error = refused(world, chat(world, messages=[]), 400, "invalid_request")
    assert error.body["param"] == "messages"  # type: ignore[index]
    error = refused(world, chat(world, max_tokens=0), 400, "invalid_request")
    assert error.body["param"] == "max_tokens"  # type: ignore[index]
    bad_json = httpx.post(
        world["url"] + "/v1/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {world['secret']}"},
    )
    assert bad_json.status_code == 400
    assert bad_json.json()["error"]["code"] == "invalid_request"


def test_400_streaming_unsupported_on_direct_triton(world):
    make_model(model_id="acme/triton-only")
    register_worker(
        "http://127.0.0.1:9",
        worker_id="triton-1",
        runtime="triton",
        models=("acme/triton-only",),
        probe=False,
        model_name="text_generation",
        input_name="text_input",
        max_tokens_input_name="max_tokens",
        output_name="text_output",
        prompt_tokens_output_name="prompt_tokens",
        completion_tokens_output_name="completion_tokens",
    )

    def call() -> Any:
        return sdk(world).chat.completions.create(model="acme/triton-only", messages=HELLO, stream=True)

    error = refused(world, call, 400, "streaming_unsupported")
    assert error.body["param"] == "stream"  # type: ignore[index]


@pytest.mark.parametrize("how", ["missing", "unknown", "revoked", "expired"])
def test_401_invalid_api_key(world, how):
    if how == "missing":
        response = httpx.post(world["url"] + "/v1/chat/completions", json={"model": "acme/model-1", "messages": HELLO})
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        return
    secret = "sk-si-unknownunkn" + "x" * 40
    if how != "unknown":
        created = make_key(account=world["account"])
        secret = created.secret
        if how == "revoked":
            api_key_revoke(api_key=created.api_key)
        else:
            ApiKey.objects.filter(pk=created.api_key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    refused(world, chat(world, secret), 401, "invalid_api_key")


def test_402_insufficient_credits(world):
    poor = make_account(name="poor")
    secret = make_key(account=poor).secret
    error = refused({**world, "account": poor}, chat(world, secret), 402, "insufficient_credits")
    # What was needed (103 prompt-bound tokens at 1 + 64 output tokens at 2 per 1M) and what there is, in
    # credits; the prompt bound is the SDK's 71-byte body + 16 for the message + 16 (docs/billing.md, The bound).
    assert "needs 0.000231 credits" in error.body["message"]  # type: ignore[index]
    assert "0.000000 available" in error.body["message"]  # type: ignore[index]
    assert UsageRecord.objects.count() == 0


def test_402_key_budget_exceeded_is_distinct_and_spent_shows_in_v1_key(world):
    # A full request holds 0.000231 credits (103 prompt-bound tokens at 1, 64 output tokens at 2 per 1M).
    capped = make_key(account=world["account"], name="ci", monthly_budget=160).secret
    error = refused(world, chat(world, capped), 402, "key_budget_exceeded")  # the account has 10 credits
    # What the request needed and what is left of the budget, in credits (as insufficient_credits says).
    assert "needs 0.000231 credits reserved; 0.000160 left of the key's monthly budget" in error.body["message"]  # type: ignore[index]
    sdk(world, secret=capped).chat.completions.create(model="acme/model-1", messages=HELLO, max_tokens=1)
    body = httpx.get(world["url"] + "/v1/key", headers={"Authorization": f"Bearer {capped}"}).json()
    budget = body["data"]["budget"]
    cost = UsageRecord.objects.get().cost
    assert cost >= 2 and budget["limit"] == "0.000160" and budget["spent"] == f"0.{cost:06d}"
    assert budget["resets_at"].endswith("-01T00:00:00Z")
    # A 0.000159 hold (an 87-byte body: 119 prompt-bound tokens, 20 output at 2) fits the budget alone, but
    # not on top of what was spent this month.
    error = refused(world, chat(world, capped, max_tokens=20), 402, "key_budget_exceeded")
    assert f"needs 0.000159 credits reserved; 0.{160 - cost:06d} left" in error.body["message"]  # type: ignore[index]


def test_403_insufficient_scope_and_model_not_allowed(world):
    models_only = make_key(account=world["account"], scopes=["models"]).secret
    refused(world, chat(world, models_only), 403, "insufficient_scope")
    make_model(model_id="acme/model-2")
    other_model = make_key(account=world["account"], allowed_models=["acme/model-2"]).secret
    refused(world, chat(world, other_model), 403, "model_not_allowed")

    no_usage_scope = make_key(account=world["account"], scopes=["chat"]).secret
    response = httpx.get(world["url"] + "/v1/key", headers={"Authorization": f"Bearer {no_usage_scope}"})
    assert (response.status_code, response.json()["error"]["code"]) == (403, "insufficient_scope")


def test_404_model_not_found(world):
    error = refused(world, chat(world, model="acme/nope"), 404, "model_not_found")
    assert error.body["param"] == "model"  # type: ignore[index]


def test_429_rate_limit_exceeded_with_retry_after(world):
    secret = make_key(account=world["account"], rpm=1).secret
    chat(world, secret)()
    error = refused(world, chat(world, secret), 429, "rate_limit_exceeded")
    headers = error.response.headers
    assert 1 <= int(headers["retry-after"]) <= 60
    assert headers["x-ratelimit-limit-requests"] == "1"
    assert headers["x-ratelimit-remaining-requests"] == "0"


def test_502_runtime_usage_unavailable(world):
    refused(
        world, chat(world, messages=[{"role": "user", "content": "[sim no-usage]"}]), 502, "runtime_usage_unavailable"
    )
    record = UsageRecord.objects.get()
    assert (record.status, record.error_code, record.cost) == ("failed", "runtime_usage_unavailable", 0)
    assert Worker.objects.get(worker_id="sim-1").consecutive_failures == 0  # not the worker's fault


def test_502_upstream_error(world):
    refused(world, chat(world, messages=[{"role": "user", "content": "[sim status=500]"}]), 502, "upstream_error")
    assert Worker.objects.get(worker_id="sim-1").consecutive_failures == 1
    assert UsageRecord.objects.get().error_code == "upstream_error"
    # A worker refusing its own credential (401) is our misconfiguration: an upstream_error, not a sick worker.
    refused(world, chat(world, messages=[{"role": "user", "content": "[sim status=401]"}]), 502, "upstream_error")
    assert Worker.objects.get(worker_id="sim-1").consecutive_failures == 1


def test_400_a_workers_refusal_reaches_the_client_in_its_own_words(world, simulator):
    """A worker's 4xx (a prompt too long, a bad parameter) is the client's to fix: 400 with the worker's
    message (its host scrubbed), nothing charged, and no count against the circuit; for streams too."""
    before = Account.objects.get(pk=world["account"].pk).available
    for stream in (False, True):
        error = refused(
            world,
            chat(world, stream=stream, messages=[{"role": "user", "content": "too long [sim status=422]"}]),
            400,
            "invalid_request",
        )
        assert error.body["message"] == "simulated failure 422"  # type: ignore[index]
    error = refused(world, embed(world, input="x [sim status=400]"), 400, "invalid_request")
    host = simulator.base_url.split("://")[1].split("/")[0]
    assert host not in str(error.body) and "127.0.0.1" not in str(error.body)
    assert error.body["message"] == "simulated failure 400 at <worker>"  # type: ignore[index]
    assert Worker.objects.get(worker_id="sim-1").consecutive_failures == 0
    assert Account.objects.get(pk=world["account"].pk).available == before
    assert {r.cost for r in UsageRecord.objects.all()} == {0}
    assert set(Reservation.objects.values_list("status", flat=True)) == {"released"}


def test_503_no_healthy_worker(world, simulator):
    make_model(model_id="acme/unserved")
    refused(world, chat(world, model="acme/unserved"), 503, "no_healthy_worker")
    Worker.objects.filter(worker_id="sim-1").update(healthy=False)
    from workers import routing

    routing.invalidate()
    refused(world, chat(world), 503, "no_healthy_worker")
    assert UsageRecord.objects.count() == 0


def test_504_upstream_timeout(world, simulator):
    register_worker(simulator.base_url, worker_id="sim-1", read_timeout=0.3)
    refused(world, chat(world, messages=[{"role": "user", "content": "[sim hang]"}]), 504, "upstream_timeout")
    assert Worker.objects.get(worker_id="sim-1").consecutive_failures == 1


def test_a_failure_before_any_byte_is_retried_once_on_another_worker(world, simulator, simulator_factory):
    broken = simulator_factory(status=500)
    register_worker(broken.base_url, worker_id="sim-broken")
    ai = sdk(world)
    for _ in range(12):
        ai.chat.completions.create(model="acme/model-1", messages=HELLO, max_tokens=2)
        if broken.simulator.stats.requests:
            break
    assert broken.simulator.stats.requests, "the broken worker was never picked"
    assert Worker.objects.get(worker_id="sim-broken").consecutive_failures >= 1
    # Each request reserved once and was settled by the healthy worker.
    assert set(Reservation.objects.values_list("status", flat=True)) == {"settled"}
    assert Account.objects.get(pk=world["account"].pk).reserved == 0


def test_when_the_retry_fails_too_nothing_is_charged(world, simulator_factory):
    Worker.objects.all().delete()
    first, second = simulator_factory(status=500), simulator_factory(status=503)
    register_worker(first.base_url, worker_id="sim-a")
    register_worker(second.base_url, worker_id="sim-b")
    refused(world, chat(world), 502, "upstream_error")
    assert len(first.simulator.stats.requests) + len(second.simulator.stats.requests) == 2
    assert Reservation.objects.get().status == "released"
