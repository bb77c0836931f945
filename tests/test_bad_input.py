"""Hostile or odd input gets a 400 or a form error, never a 500."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from django.test import Client

from accounts.models import Account
from accounts.services import account_user_create
from billing.models import Reservation
from proxy.payloads import MAX_JSON_DEPTH
from tests.factories import make_account

PASSWORD = "correct horse battery staple"


def post(world: dict[str, Any], body: bytes | dict[str, Any]) -> httpx.Response:
    kwargs: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
    return httpx.post(
        world["url"] + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {world['secret']}", "Content-Type": "application/json"},
        timeout=30,
        **kwargs,
    )


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_gateway")
def test_deeply_nested_json_is_a_400_in_any_field_not_a_500(world):
    hello = b'{"model":"acme/model-1","messages":[{"role":"user","content":"hi"}]'
    for depth in (254, 255, 600, 1023):
        for field in (b"metadata", b"tools", b"response_format", b"x_vendor"):
            response = post(world, hello + b',"' + field + b'":' + nested(depth) + b"}")
            assert response.status_code == 400, (depth, field, response.text[:200])
            error = response.json()["error"]
            assert error["code"] == "invalid_request" and "nests more than" in error["message"]
    embeddings = httpx.post(
        world["url"] + "/v1/embeddings",
        content=b'{"model":"acme/model-1","input":"hi","x":' + nested(500) + b"}",
        headers={"Authorization": f"Bearer {world['secret']}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert embeddings.status_code == 400 and embeddings.json()["error"]["code"] == "invalid_request"
    # A body at the limit is still served.
    ok = post(world, hello + b',"metadata":' + nested(MAX_JSON_DEPTH - 2) + b"}")
    assert ok.status_code != 500
    account = Account.objects.get(pk=world["account"].pk)
    assert account.reserved == 0 and not Reservation.objects.filter(status="held").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_gateway")
def test_booleans_are_not_integers(world):
    hello = {"model": "acme/model-1", "messages": [{"role": "user", "content": "hi"}]}
    for field, value in (("n", True), ("best_of", True), ("n", 1.5), ("max_tokens", True), ("n", "1")):
        response = post(world, {**hello, field: value})
        assert response.status_code == 400, (field, value)
        assert response.json()["error"]["param"] == field
    assert post(world, {**hello, "n": 1}).status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query",
    [
        "start=9999-12-01",
        "end=0001-01-01",
        "start=9999-12-01&end=9999-12-31",
        "start=0001-01-01&end=0001-01-02",
    ],
)
def test_dashboard_dates_at_the_calendar_edges_are_a_form_error(query):
    account = make_account(name="dates")
    account_user_create(account=account, email="dates@example.com", password=PASSWORD)
    client = Client()
    assert client.login(username="dates@example.com", password=PASSWORD)
    page = client.get(f"/dashboard/usage/?{query}")
    assert page.status_code == 200
    assert b"Choose a date between 2000-01-01 and 2999-12-31" in page.content
    csv = client.get(f"/dashboard/usage.csv?{query}")
    assert csv.status_code == 200
    assert b"".join(csv.streaming_content).startswith(b"created_at,")  # type: ignore[attr-defined]
