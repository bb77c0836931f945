"""The /v1 reference (/docs/v1.json) is kept honest: the gateway's real answers match it."""

from __future__ import annotations

import httpx
import jsonschema
import pytest

from console.pages import v1_document
from tests.factories import make_account, make_key, make_model
from tests.openapi_check import check_response
from tests.servers import register_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]
HELLO = [{"role": "user", "content": "hello [sim deltas=3]"}]


def test_every_v1_answer_matches_the_document(gateway_server, simulator):
    make_model(model_id="acme/model-1", max_output_tokens=64)
    account = make_account(name="docs", credits=10)
    auth = {"Authorization": f"Bearer {make_key(account=account, monthly_budget=5_000_000).secret}"}
    poor = {"Authorization": f"Bearer {make_key(account=make_account(name='poor')).secret}"}
    register_worker(simulator.base_url)
    doc = v1_document()
    url = gateway_server.url
    calls = [
        ("post", "/v1/chat/completions", auth, {"model": "acme/model-1", "messages": HELLO}, 200),
        ("post", "/v1/completions", auth, {"model": "acme/model-1", "prompt": "hello", "max_tokens": 4}, 200),
        ("post", "/v1/embeddings", auth, {"model": "acme/model-1", "input": ["one two", "three"]}, 200),
        ("post", "/v1/responses", auth, {"model": "acme/model-1", "input": "hello [sim deltas=3]"}, 200),
        ("post", "/v1/responses", auth, {"model": "acme/model-1", "input": "hi", "store": True}, 400),
        ("post", "/v1/rerank", auth, {"model": "acme/model-1", "query": "a b", "documents": ["a", "b c"]}, 200),
        ("post", "/v1/rerank", auth, {"model": "acme/model-1", "query": "", "documents": ["a"]}, 400),
        ("get", "/v1/models", auth, None, 200),
        ("get", "/v1/models/acme/model-1", auth, None, 200),
        ("get", "/v1/models/acme/none", auth, None, 404),
        ("get", "/v1/key", auth, None, 200),
        ("get", "/v1/usage", auth, None, 200),
        ("post", "/v1/chat/completions", {}, {"model": "acme/model-1", "messages": HELLO}, 401),
        ("post", "/v1/chat/completions", poor, {"model": "acme/model-1", "messages": HELLO}, 402),
        ("post", "/v1/chat/completions", auth, {"model": "acme/none", "messages": HELLO}, 404),
        ("post", "/v1/chat/completions", auth, {"model": "acme/model-1", "messages": []}, 400),
        ("get", "/v1/usage?limit=0", auth, None, 400),
    ]
    for method, path, headers, body, status in calls:
        response = httpx.request(method, url + path, headers=headers, json=body, timeout=30)
        assert response.status_code == status, (path, response.text)
        documented = "/v1/models/{model}" if path.startswith("/v1/models/") else path.split("?")[0]
        check_response(doc, documented, method, status, response.json())
    assert httpx.get(url + "/v1/key", headers=auth).json()["data"]["budget"]["limit"] == "5.000000"
    # The check has teeth: a body that breaks the document is caught.
    with pytest.raises(jsonschema.ValidationError):
        check_response(doc, "/v1/key", "get", 200, {"data": {"name": "x"}})
