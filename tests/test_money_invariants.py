"""The money invariants (docs/interface.md) through the gateway: overruns, absurd counts, stream timeouts, leases."""

from __future__ import annotations

import re
import threading
import time
from io import StringIO
from typing import Any

import httpx
import openai
import orjson
import pytest
from aiohttp import web
from django.core.management import call_command
from django.test import Client

from accounts.models import Account
from billing.models import LedgerEntry, Reservation, UsageRecord
from core.credits import MICRO
from devtools.simulator import SimulatorThread
from tests.factories import make_account, make_key, make_model, money
from tests.servers import register_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]


def customer(gateway_server, *, credits_micro: int, name: str) -> dict[str, Any]:
    account = make_account(name=name, credits=0)
    Account.objects.filter(pk=account.pk).update(available=credits_micro)
    LedgerEntry.objects.create(
        account=account,
        kind="grant",
        amount=credits_micro,
        available_delta=credits_micro,
        reserved_delta=0,
        available_after=credits_micro,
        reserved_after=0,
    )
    secret = make_key(account=account).secret
    return {"account": account, "secret": secret, "url": gateway_server.url}


def post(who: dict[str, Any], content: str, *, stream: bool = False, timeout: float = 20, **body: Any) -> Any:
    payload = {"model": "acme/model-1", "messages": [{"role": "user", "content": content}], "stream": stream, **body}
    headers = {"Authorization": f"Bearer {who['secret']}"}
    return httpx.post(who["url"] + "/v1/chat/completions", json=payload, headers=headers, timeout=timeout)


def sse_payloads(response: httpx.Response) -> list[bytes]:
    return [line[6:].encode() for line in response.text.splitlines() if line.startswith("data: ")]


def metric(name: str, **labels: str) -> float:
    text = Client().get("/metrics").content.decode()
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def priced(simulator):
    # 1 credit per 1M prompt tokens, 2 per 1M completion tokens: 1M + 1M tokens cost 3 credits.
    make_model(model_id="acme/model-1", max_output_tokens=64, input_price=MICRO, output_price=2 * MICRO)
    register_worker(simulator.base_url, worker_id="sim-greedy")
    return simulator


@pytest.mark.parametrize("stream", [False, True])
def test_a_worker_reporting_1m_plus_1m_tokens_for_max_tokens_4_never_overdraws(
    gateway_server, priced, admin_client, stream
):
    who = customer(gateway_server, credits_micro=MICRO, name=f"overrun-{stream}")
    before = metric("speedinfer_uncharged_overrun_credits_total", worker="sim-greedy")
    response = post(who, "hello [sim usage=1000000,1000000]", stream=stream, max_tokens=4)
    assert response.status_code == 200
    if stream:
        assert sse_payloads(response)[-1] == b"[DONE]"
    else:
        assert response.json()["usage"]["completion_tokens"] == 1_000_000  # the worker's word, forwarded

    # Charged what the account had (1 credit), not the 3 credits reported; never below zero.
    assert money(who["account"]) == (0, 0)
    record = UsageRecord.objects.get(account=who["account"])
    assert (record.cost, record.uncharged) == (MICRO, 2 * MICRO)
    assert record.overrun == 3 * MICRO - record.reserved
    assert record.worker_id == "sim-greedy"
    settle_row = LedgerEntry.objects.get(account=who["account"], kind="settle")
    assert settle_row.amount == MICRO and "uncharged overrun 2000000 micro-credits" in settle_row.note

    # Staff see it: the /metrics counter per worker, and the admin's usage list filtered by worker.
    assert metric("speedinfer_uncharged_overrun_credits_total", worker="sim-greedy") == before + 2
    page = admin_client.get("/admin/billing/usagerecord/?uncharged=yes&worker_id=sim-greedy").content.decode()
    assert record.request_id in page
    assert re.search(r'<td class="field-uncharged_credits">\s*(<span[^>]*>)?2\.00\b', page), "uncharged column"
    assert record.request_id not in admin_client.get("/admin/billing/usagerecord/?uncharged=no").content.decode()

    # The next request finds nothing available: a clean 402.
    assert post(who, "again", stream=stream, max_tokens=4).status_code == 402


@pytest.mark.parametrize("counts", ["2147483648,1", "1,2147483648", "-1,1", "1.5,2", "1,true", "1,1000000001"])
@pytest.mark.parametrize("stream", [False, True])
def test_absurd_counts_from_an_openai_worker_are_a_clean_502_and_nothing_is_held(
    gateway_server, priced, counts, stream
):
    who = customer(gateway_server, credits_micro=10 * MICRO, name=f"absurd-{stream}-{counts}")
    response = post(who, f"hello [sim usage={counts}]", stream=stream, max_tokens=4)
    if stream:
        assert response.status_code == 200
        events = sse_payloads(response)
        assert b"[DONE]" not in events
        assert orjson.loads(events[-1])["error"]["code"] == "runtime_usage_unavailable"
    else:
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "runtime_usage_unavailable"
    assert money(who["account"]) == (10 * MICRO, 0)
    assert not Reservation.objects.filter(account=who["account"], status="held").exists()
    assert UsageRecord.objects.get(account=who["account"]).cost == 0


class _FakeTriton:
    """A Triton-shaped HTTP worker (KServe v2) whose count tensors say 2^31: the real server's int32
    tensors cannot, but an INT64 output can."""

    def app(self) -> web.Application:
        async def ready(request: web.Request) -> web.Response:
            return web.json_response({})

        async def index(request: web.Request) -> web.Response:
            return web.json_response([{"name": "big_counts", "state": "READY"}])

        async def infer(request: web.Request) -> web.Response:
            outputs = [
                {"name": "text_output", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]},
                {"name": "prompt_tokens", "datatype": "INT64", "shape": [1, 1], "data": [2**31]},
                {"name": "completion_tokens", "datatype": "INT64", "shape": [1, 1], "data": [1]},
            ]
            return web.json_response({"model_name": "big_counts", "outputs": outputs})

        app = web.Application()
        app.router.add_get("/v2/health/ready", ready)
        app.router.add_get("/v2/models/{name}/ready", ready)
        app.router.add_post("/v2/repository/index", index)
        app.router.add_post("/v2/models/{name}/infer", infer)
        return app


def test_a_count_of_2_31_from_a_triton_worker_is_a_clean_502_and_nothing_is_held(gateway_server):
    thread = SimulatorThread(_FakeTriton()).start()  # type: ignore[arg-type]
    try:
        make_model(model_id="acme/model-1", max_output_tokens=8)
        register_worker(
            f"http://127.0.0.1:{thread.port}",
            worker_id="triton-big",
            runtime="triton",
            model_name="big_counts",
            input_name="text_input",
            max_tokens_input_name="max_tokens",
            output_name="text_output",
            prompt_tokens_output_name="prompt_tokens",
            completion_tokens_output_name="completion_tokens",
        )
        who = customer(gateway_server, credits_micro=10 * MICRO, name="triton-absurd")
        response = post(who, "hello", max_tokens=4)
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "runtime_usage_unavailable"
        assert money(who["account"]) == (10 * MICRO, 0)
        assert not Reservation.objects.filter(account=who["account"], status="held").exists()
    finally:
        thread.stop()


@pytest.fixture
def slow_worker(simulator):
    make_model(model_id="acme/model-1", max_output_tokens=64)
    register_worker(simulator.base_url, worker_id="sim-slow", read_timeout=1, total_timeout=2.5)
    return simulator


def test_a_stream_is_stopped_at_its_total_timeout_with_an_error_event(gateway_server, slow_worker):
    who = customer(gateway_server, credits_micro=10 * MICRO, name="total-timeout")
    started = time.monotonic()
    # 64 chunks, one every 0.3 s: about 19 s if nothing stopped it; each gap is under the 1 s read timeout.
    response = post(who, "hello [sim deltas=64 delay=300]", stream=True)
    took = time.monotonic() - started
    events = sse_payloads(response)
    assert response.status_code == 200 and b"[DONE]" not in events
    assert orjson.loads(events[-1])["error"]["code"] == "upstream_timeout"
    assert len(events) > 3  # content was flowing
    assert 2.4 < took < 4.0, took
    assert money(who["account"]) == (10 * MICRO, 0)  # docs/interface.md, Errors: upstream_timeout charges nothing


def test_an_upstream_sending_only_comments_gets_a_504_within_the_read_timeout(gateway_server, slow_worker):
    who = customer(gateway_server, credits_micro=10 * MICRO, name="comments-only")
    started = time.monotonic()
    response = post(who, "hello [sim comments]", stream=True)
    took = time.monotonic() - started
    assert response.status_code == 504 and response.json()["error"]["code"] == "upstream_timeout"
    assert 0.9 < took < 2.5, took
    assert money(who["account"]) == (10 * MICRO, 0)


def test_the_sweeper_never_frees_a_running_stream_and_its_content_is_charged(gateway_server, simulator, monkeypatch):
    from datetime import timedelta

    import billing.services

    # A 2 s lease renewed every 0.5 s (by the process's lease keeper), so the 5 s stream outlives several leases.
    monkeypatch.setattr(billing.services, "LEASE", timedelta(seconds=2))
    monkeypatch.setattr(billing.services, "LEASE_RENEW_EVERY", timedelta(seconds=0.5))
    make_model(model_id="acme/model-1", max_output_tokens=64, input_price=MICRO, output_price=MICRO)
    register_worker(simulator.base_url, worker_id="sim-long")
    who = customer(gateway_server, credits_micro=10 * MICRO, name="long-stream")
    result: dict[str, Any] = {}

    def stream() -> None:
        result["response"] = post(who, "hello [sim deltas=25 delay=200]", stream=True, timeout=30)

    runner = threading.Thread(target=stream)
    runner.start()
    swept = []
    for _ in range(3):
        time.sleep(1.5)
        out = StringIO()
        call_command("sweepreservations", "--older-than", "1", stdout=out)
        swept.append(int(out.getvalue()))
    runner.join(30)
    assert swept == [0, 0, 0]
    events = sse_payloads(result["response"])
    assert events[-1] == b"[DONE]"
    record = UsageRecord.objects.get(account=who["account"])
    assert record.completion_tokens == 25 and record.cost > 0
    assert Reservation.objects.get(account=who["account"]).status == "settled"
    assert money(who["account"]) == (10 * MICRO - record.cost, 0)


def test_the_openai_sdk_sees_the_capped_charge_as_an_ordinary_answer(gateway_server, priced):
    who = customer(gateway_server, credits_micro=MICRO, name="sdk-overrun")
    ai = openai.OpenAI(base_url=who["url"] + "/v1", api_key=who["secret"], max_retries=0)
    reply = ai.chat.completions.create(
        model="acme/model-1", messages=[{"role": "user", "content": "hi [sim usage=1000000,1000000]"}], max_tokens=4
    )
    assert reply.usage is not None and reply.usage.total_tokens == 2_000_000
    assert money(who["account"])[0] == 0
