"""Many simultaneous requests on an account that can afford only a few, and the hot path's query count."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from asgiref.sync import async_to_sync

from accounts.models import Account
from billing.models import Reservation, UsageRecord
from billing.selectors import ledger_totals
from core.credits import MICRO
from tests.factories import make_account, make_key, make_model
from tests.servers import register_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]


@pytest.mark.slow
def test_simultaneous_requests_never_overdraw(gateway_server, simulator):
    # 0.01 credit per completion token, prompts free: 30 tokens reserve (and cost) 0.3 credit; 1 credit buys 3.
    make_model(model_id="acme/model-1", input_price=0, output_price=10_000 * MICRO, max_output_tokens=30)
    account = make_account(name="thrifty", credits=1)
    secret = make_key(account=account).secret
    register_worker(simulator.base_url)

    async def one(ai: openai.AsyncOpenAI) -> int:
        try:
            await ai.chat.completions.create(
                model="acme/model-1", messages=[{"role": "user", "content": "[sim latency=200 deltas=30]"}]
            )
        except openai.APIStatusError as error:
            assert error.body["code"] == "insufficient_credits"  # type: ignore[index]
            return error.status_code
        return 200

    async def run() -> list[int]:
        async with openai.AsyncOpenAI(
            base_url=gateway_server.url + "/v1", api_key=secret, max_retries=0, timeout=30
        ) as ai:
            return await asyncio.gather(*(one(ai) for _ in range(20)))

    statuses = asyncio.run(run())
    assert statuses.count(200) == 3
    assert statuses.count(402) == 17
    account.refresh_from_db()
    assert (account.available, account.reserved) == (100_000, 0)
    totals = ledger_totals(account=account)
    assert (totals.available, totals.reserved) == (account.available, account.reserved)
    assert Reservation.objects.filter(status="settled").count() == 3
    assert UsageRecord.objects.filter(status="ok").count() == 3


def test_a_warm_request_costs_two_queries(simulator, django_assert_num_queries):
    """One round trip to reserve and one to settle (PostgreSQL: a data-modifying CTE each on the event loop's
    pool; SQLite: one transaction each on the process's own connection), so Django's own connection sees
    none; the key, the model, the worker and its circuit state come from memory."""
    from billing.ledger import ledger
    from speedinfer.asgi import application

    make_model(model_id="acme/model-1")
    account = make_account(name="counted", credits=5)
    secret = make_key(account=account).secret
    register_worker(simulator.base_url)

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.post(
                "/v1/chat/completions",
                json={"model": "acme/model-1", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {secret}"},
            )

    assert async_to_sync(post)().status_code == 200  # warms the key cache, models, routing snapshot, last-used
    before = ledger().loop_round_trips()
    with django_assert_num_queries(0):
        response = async_to_sync(post)()
    assert ledger().loop_round_trips() - before == 2
    assert response.status_code == 200
    assert Account.objects.get(pk=account.pk).reserved == 0
