"""The landing page and the API reference: what a first visitor and a developer see."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.staticfiles import finders
from django.test import Client
from django.utils import timezone

from console.templatetags.credits import ago
from core.credits import display_credits

pytestmark = pytest.mark.django_db


def test_landing_page_says_what_this_is_and_where_to_go(client):
    page = client.get("/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "OpenAI-compatible" in html and "http://testserver/v1" in html
    assert 'href="/accounts/login/' in html and 'href="/docs/"' in html


def test_v1_reference_is_an_openapi_document_with_a_browsable_page(client):
    document = client.get("/docs/v1.json").json()
    assert document["openapi"].startswith("3.")
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/key", "/v1/usage"} <= set(document["paths"])
    page = client.get("/docs/v1/").content.decode()
    assert "redoc.standalone.js" in page and "/docs/v1.json" in page
    assert finders.find("drf_spectacular_sidecar/redoc/bundles/redoc.standalone.js")  # no CDN: offline works
    assert "docs-v1" in client.get("/docs/").content.decode() or "/docs/v1/" in client.get("/docs/").content.decode()


def test_staff_api_reference_is_for_staff(django_user_model):
    anonymous = Client()
    assert anonymous.get("/api/schema/").status_code in (401, 403)
    staff = django_user_model.objects.create_user(username="ops", password="pw-123456", is_staff=True)
    client = Client()
    client.force_login(staff)
    schema = client.get("/api/schema/?format=json").json()
    assert "/api/keys/{key_id}/budget/" in schema["paths"] and "/api/workers/" in schema["paths"]
    docs = client.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content


def test_credits_read_the_same_everywhere_and_times_say_just_now():
    assert [display_credits(m) for m in (502, 10_000_000, 1_234_500_000, 0)] == [
        "0.000502",
        "10.00",
        "1,234.50",
        "0.00",
    ]
    assert ago(timezone.now()) == "just now"
    assert ago(timezone.now() - timedelta(minutes=5)) == "5\xa0minutes ago"
