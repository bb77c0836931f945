"""The small gaps a client hits: JSON 404s for API-looking paths, 413 for a body over the limit, the
max_tokens clamp header, sanitised request ids, /v1/key's expiry, a model's kind deciding its endpoints,
and 402 as the openai SDK raises it."""

from __future__ import annotations

from datetime import timedelta

import httpx
import openai
import pytest
from django.utils import timezone

from billing.models import UsageRecord
from core.credits import MICRO
from devtools.simulator import Simulator, SimulatorThread
from proxy.exchange import MAX_BODY_BYTES
from tests.factories import make_account, make_key, make_model, money
from tests.servers import register_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]


@pytest.fixture
def world(gateway_server, simulator):
    make_model(model_id="acme/model-1", max_output_tokens=64)
    account = make_account(name="owner", credits=10)
    created = make_key(account=account, name="k1")
    register_worker(simulator.base_url)
    headers = {"Authorization": f"Bearer {created.secret}"}
    return {"account": account, "secret": created.secret, "url": gateway_server.url, "headers": headers}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1"),
        ("GET", "/v1/"),
        ("GET", "/v1/nothing/here"),
        ("POST", "/v1/audio/speech"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("POST", "/rerank"),
        ("POST", "/v2/rerank"),
        ("GET", "/v2/models"),
        ("POST", "/chat/completions"),
    ],
)
def test_unknown_api_paths_answer_an_openai_shaped_json_404(world, method, path):
    answer = httpx.request(method, world["url"] + path, headers=world["headers"])
    assert answer.status_code == 404
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json()["error"]["code"] == "not_found"


def test_the_site_pages_are_still_django(world):
    assert httpx.get(world["url"] + "/health").headers["content-type"].startswith("application/json")
    assert "text/html" in httpx.get(world["url"] + "/docs/v1/").headers["content-type"]


def test_a_body_over_the_limit_is_413_in_mib(world):
    body = b'{"model": "acme/model-1", "messages": [{"role": "user", "content": "' + b"x" * MAX_BODY_BYTES + b'"}]}'
    answer = httpx.post(
        world["url"] + "/v1/chat/completions",
        content=body,
        headers={**world["headers"], "content-type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 413
    error = answer.json()["error"]
    assert error["code"] == "request_too_large" and "8 MiB" in error["message"]


def test_max_tokens_above_the_cap_is_clamped_and_the_answer_says_so(world, simulator):
    ai = openai.OpenAI(base_url=world["url"] + "/v1", api_key=world["secret"], max_retries=0)
    raw = ai.chat.completions.with_raw_response.create(
        model="acme/model-1", max_tokens=1000, messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.headers["x-speedinfer-max-tokens-clamped"] == "64"
    assert simulator.simulator.stats.requests[-1]["body"]["max_tokens"] == 64
    within = ai.chat.completions.with_raw_response.create(
        model="acme/model-1", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    )
    assert "x-speedinfer-max-tokens-clamped" not in within.headers
    translated = ai.responses.with_raw_response.create(model="acme/model-1", input="hi", max_output_tokens=500)
    assert translated.headers["x-speedinfer-max-tokens-clamped"] == "64"


def test_a_request_id_outside_the_alphabet_is_kept_sanitised(world):
    def echoed(value: bytes) -> str:
        answer = httpx.get(world["url"] + "/v1/models", headers={**world["headers"], "X-Request-ID": value})
        return answer.headers["x-request-id"]

    assert echoed(b"trace-abc:1.2_3") == "trace-abc:1.2_3"
    assert echoed(b"trace id/42 \xc3\xa9") == "trace_id_42"
    assert echoed(b"a" * 150) == "a" * 100
    assert len(echoed(b"///")) == 32  # nothing left: a fresh id


def test_v1_key_shows_the_expiry(world):
    expires = timezone.now() + timedelta(days=3)
    expiring = make_key(account=world["account"], name="expiring", expires_at=expires)
    data = httpx.get(world["url"] + "/v1/key", headers={"Authorization": f"Bearer {expiring.secret}"}).json()["data"]
    assert data["expires_at"] == expires.isoformat()
    assert httpx.get(world["url"] + "/v1/key", headers=world["headers"]).json()["data"]["expires_at"] is None


def test_a_models_kind_decides_which_endpoints_it_serves(world):
    make_model(model_id="acme/embed-1", kind="embeddings")
    make_model(model_id="acme/chat-only", kind="chat")
    both = SimulatorThread(Simulator(models=("acme/embed-1", "acme/chat-only"))).start()
    try:
        register_worker(both.base_url, worker_id="sim-2", models=("acme/embed-1", "acme/chat-only"))
        url, headers = world["url"], world["headers"]
        chat = {"model": "acme/embed-1", "messages": [{"role": "user", "content": "hi"}]}
        refused = httpx.post(url + "/v1/chat/completions", json=chat, headers=headers)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "model" and "/v1/chat/completions" in error["message"]
        embed = {"model": "acme/chat-only", "input": "hi"}
        refused = httpx.post(url + "/v1/embeddings", json=embed, headers=headers)
        assert refused.status_code == 400 and "/v1/embeddings" in refused.json()["error"]["message"]
        served = httpx.post(url + "/v1/embeddings", json={**embed, "model": "acme/embed-1"}, headers=headers)
        assert served.status_code == 200
        assert UsageRecord.objects.count() == 1  # the refusals charged nothing
        listed = httpx.get(url + "/v1/models", headers=headers).json()["data"]
        assert {m["id"]: m["kind"] for m in listed} == {
            "acme/chat-only": "chat",
            "acme/embed-1": "embeddings",
            "acme/model-1": "any",
        }
    finally:
        both.stop()


def test_402_is_an_api_status_error_with_the_code_in_the_sdk(world):
    poor = make_key(account=make_account(name="poor"), name="poor").secret
    ai = openai.OpenAI(base_url=world["url"] + "/v1", api_key=poor, max_retries=0)
    with pytest.raises(openai.APIStatusError) as refused:
        ai.chat.completions.create(model="acme/model-1", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 402
    assert refused.value.code == "insufficient_credits"
    assert money(world["account"]) == (10 * MICRO, 0)


def test_the_price_list_page_is_html_for_a_browser_and_a_json_404_for_an_api_client(world):
    page = httpx.get(world["url"] + "/models/", headers={"Accept": "text/html,application/xhtml+xml"})
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    api = httpx.get(world["url"] + "/models", headers={"Authorization": world["headers"]["Authorization"]})
    assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"
