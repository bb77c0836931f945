"""The gateway through the official openai SDK, against a real server and the worker simulator."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from accounts.models import Account
from billing.models import LedgerEntry, Reservation, UsageRecord
from billing.selectors import ledger_totals
from core.credits import MICRO
from tests.factories import make_account, make_key, make_model
from tests.fixtures import sdk
from tests.servers import register_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]


@pytest.fixture
def world(make_world):
    # Prices: 1 credit per 1M prompt tokens, 2 per 1M completion tokens.
    return make_world(account="owner", key={"name": "k1"})


def test_chat_completion_is_answered_and_settled_from_the_workers_usage(world, simulator):
    reply = sdk(world).chat.completions.create(
        model="acme/model-1", messages=[{"role": "user", "content": "say hello to me [sim deltas=5]"}]
    )
    assert reply.model == "acme/model-1"
    assert reply.choices[0].message.content == "SpeedInfer routes every request"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (6, 5)
    account = Account.objects.get(pk=world["account"].pk)
    cost = -(-(6 * MICRO + 5 * 2 * MICRO) // 1_000_000)
    assert account.available == 10 * MICRO - cost
    assert account.reserved == 0
    record = UsageRecord.objects.get()
    assert (record.prompt_tokens, record.completion_tokens, record.cost, record.status) == (6, 5, cost, "ok")
    assert record.worker_id == "sim-1" and record.endpoint == "/v1/chat/completions"
    totals = ledger_totals(account=account)
    assert (totals.available, totals.reserved) == (account.available, account.reserved)
    # Without max_tokens the model's cap was reserved and sent upstream.
    sent = simulator.simulator.stats.requests[-1]
    assert sent["body"]["max_tokens"] == 64
    # The prompt bound is the body the SDK sent (docs/billing.md, The bound) + 16 for the message + 16.
    body = b'{"messages":[{"role":"user","content":"say hello to me [sim deltas=5]"}],"model":"acme/model-1"}'
    assert Reservation.objects.get().amount == -(-((len(body) + 32) * MICRO + 64 * 2 * MICRO) // 1_000_000)


def test_max_tokens_is_capped_and_the_public_model_is_mapped_for_the_worker(world, simulator):
    register_worker(simulator.base_url, worker_id="sim-1", model_map={"acme/model-1": "upstream/model-1"})
    reply = sdk(world).chat.completions.create(
        model="acme/model-1", max_tokens=1000, messages=[{"role": "user", "content": "hi"}]
    )
    sent = simulator.simulator.stats.requests[-1]
    assert sent["body"]["model"] == "upstream/model-1"
    assert sent["body"]["max_tokens"] == 64
    assert reply.model == "acme/model-1"


def test_legacy_completions(world):
    reply = sdk(world).completions.create(model="acme/model-1", prompt="one two three", max_tokens=3)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == "SpeedInfer routes"
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    assert UsageRecord.objects.get().endpoint == "/v1/completions"


def test_async_sdk(world):
    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=world["url"] + "/v1", api_key=world["secret"], max_retries=0) as ai:
            replies = await asyncio.gather(
                *(
                    ai.chat.completions.create(
                        model="acme/model-1", max_tokens=2, messages=[{"role": "user", "content": f"n {i}"}]
                    )
                    for i in range(5)
                )
            )
        return [r.choices[0].message.content or "" for r in replies]

    assert asyncio.run(run()) == ["SpeedInfer"] * 5
    assert UsageRecord.objects.count() == 5
    assert Account.objects.get(pk=world["account"].pk).reserved == 0


def test_request_id_is_echoed_and_stored(world):
    raw = sdk(world).chat.completions.with_raw_response.create(
        model="acme/model-1",
        max_tokens=2,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"X-Request-ID": "trace-abc-123"},
    )
    assert raw.headers["x-request-id"] == "trace-abc-123"
    assert UsageRecord.objects.get().request_id == "trace-abc-123"
    assert Reservation.objects.get().request_id == "trace-abc-123"
    generated = httpx.get(world["url"] + "/v1/models", headers={"Authorization": f"Bearer {world['secret']}"})
    assert len(generated.headers["x-request-id"]) == 32


def test_models_lists_the_enabled_models_the_key_may_use(world):
    make_model(model_id="acme/model-2")
    make_model(model_id="acme/hidden").__class__.objects.filter(model_id="acme/hidden").update(enabled=False)
    assert [m.id for m in sdk(world).models.list()] == ["acme/model-1", "acme/model-2"]
    limited = make_key(account=world["account"], name="limited", allowed_models=["acme/model-2"])
    listed = openai.OpenAI(base_url=world["url"] + "/v1", api_key=limited.secret, max_retries=0).models.list()
    assert [m.id for m in listed] == ["acme/model-2"]


def test_key_shows_the_contract_shape(world):
    limited = make_key(
        account=world["account"], name="ci", scopes=["chat", "usage"], allowed_models=["acme/model-1"], rpm=60, tpm=1000
    )
    body = httpx.get(world["url"] + "/v1/key", headers={"Authorization": f"Bearer {limited.secret}"}).json()
    assert body == {
        "data": {
            "name": "ci",
            "prefix": limited.api_key.prefix,
            "account": "owner",
            "scopes": ["chat", "usage"],
            "models": ["acme/model-1"],
            "rate_limit": {"rpm": 60, "tpm": 1000},
            "balance": "10.000000",
            "reserved": "0.000000",
            "budget": None,
            "expires_at": None,
            "priority": "normal",
        }
    }


def test_usage_lists_the_accounts_records_newest_first_in_pages(world):
    ai = sdk(world)
    for i in range(3):
        ai.chat.completions.create(
            model="acme/model-1",
            max_tokens=1,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"X-Request-ID": f"req-{i}"},
        )
    other = make_account(name="outsider", credits=1)
    make_key(account=other)  # an outsider's records never show
    auth = {"Authorization": f"Bearer {world['secret']}"}
    first = httpx.get(world["url"] + "/v1/usage?limit=2", headers=auth).json()
    assert [r["request_id"] for r in first["data"]] == ["req-2", "req-1"]
    assert first["has_more"] is True
    assert first["data"][0]["cost"] == "0.000003" and first["data"][0]["status"] == "ok"
    second = httpx.get(world["url"] + f"/v1/usage?limit=2&after={first['last_id']}", headers=auth).json()
    assert [r["request_id"] for r in second["data"]] == ["req-0"]
    assert second["has_more"] is False


def test_ledger_balances_after_mixed_outcomes(world):
    ai = sdk(world)
    ai.chat.completions.create(model="acme/model-1", messages=[{"role": "user", "content": "ok"}])
    with pytest.raises(openai.APIStatusError):
        ai.chat.completions.create(model="acme/model-1", messages=[{"role": "user", "content": "[sim no-usage]"}])
    account = Account.objects.get(pk=world["account"].pk)
    totals = ledger_totals(account=account)
    assert (totals.available, totals.reserved) == (account.available, 0)
    assert LedgerEntry.objects.filter(kind="release").count() == 1


def test_each_request_logs_one_json_line_without_secrets(world, caplog):
    import json
    import logging

    caplog.set_level(logging.INFO, logger="speedinfer.requests")
    sdk(world).chat.completions.create(
        model="acme/model-1", messages=[{"role": "user", "content": "log me"}], extra_headers={"X-Request-ID": "log-1"}
    )
    with pytest.raises(openai.NotFoundError):
        sdk(world).chat.completions.create(model="nope/model", messages=[{"role": "user", "content": "x"}])

    def logged() -> list[dict]:
        return [json.loads(r.getMessage()) for r in caplog.records if r.name == "speedinfer.requests"]

    # The line is written once the response has gone out, so it can trail the client by a moment.
    deadline = time.monotonic() + 5
    while len(logged()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    lines = logged()
    assert len(lines) == 2
    ok, missing = lines
    assert ok["request_id"] == "log-1" and ok["status"] == 200 and ok["worker"] == "sim-1"
    assert ok["account"] == world["account"].pk and ok["key"] == world["key"].prefix
    assert ok["prompt_tokens"] > 0 and ok["completion_tokens"] > 0 and ok["error"] is None
    assert missing["status"] == 404 and missing["error"] == "model_not_found"
    # The test's own HTTP client logs its URLs; the product's loggers must not.
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("speedinfer"))
    assert world["secret"] not in ours and "127.0.0.1" not in ours


def test_the_gateway_survives_its_database_connections_being_cut(world):
    """A PostgreSQL restart (here: every other session terminated) must not leave broken connections
    that fail later requests: pooled ones are replaced, Django's are checked before use."""
    from django.db import connection

    from accounts import key_cache
    from catalog import cache as catalog

    def ask() -> int:
        reply = sdk(world).chat.completions.create(
            model="acme/model-1", messages=[{"role": "user", "content": "still there?"}]
        )
        return reply.usage.completion_tokens if reply.usage else 0

    assert ask() > 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone()[0] >= 1
    key_cache.clear()  # so the next requests read the key (and models) through Django's connections again
    catalog.forget()
    failures = 0
    for _ in range(4):
        try:
            ask()
        except openai.InternalServerError:
            failures += 1
    assert failures == 0
    assert Account.objects.get(pk=world["account"].pk).reserved == 0
