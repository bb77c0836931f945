"""Server-sent events through the gateway: forwarded as they arrive, settled on the usage event."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import orjson
import pytest

from accounts.models import Account
from billing.models import Reservation, UsageRecord
from billing.selectors import ledger_totals
from core.credits import MICRO
from tests.fixtures import sdk
from tests.servers import stream_events
from workers.models import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]


@pytest.fixture
def world(make_world):
    return make_world(account="streamer")


def raw_events(world, content: str, **body) -> list[bytes]:
    """Every SSE data payload, in order, read with a plain HTTP client."""
    payload = {"model": "acme/model-1", "stream": True, "messages": [{"role": "user", "content": content}], **body}
    return [data for _, data in stream_events(world["url"], "/v1/chat/completions", world["secret"], payload)]


def balance(world) -> tuple[int, int]:
    account = Account.objects.get(pk=world["account"].pk)
    return account.available, account.reserved


def test_sdk_stream_with_usage_settles_and_usage_precedes_done(world):
    stream = sdk(world).chat.completions.create(
        model="acme/model-1",
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "stream this [sim deltas=4]"}],
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "SpeedInfer routes every"
    assert all(c.model == "acme/model-1" for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (4, 4)
    record = UsageRecord.objects.get()
    assert (record.prompt_tokens, record.completion_tokens, record.streamed, record.status) == (4, 4, True, "ok")
    assert record.ttft_ms is not None
    assert balance(world) == (10 * MICRO - record.cost, 0)

    events = raw_events(world, "again [sim deltas=3]", stream_options={"include_usage": True})
    assert events[-1] == b"[DONE]"
    assert orjson.loads(events[-2])["usage"]["completion_tokens"] == 3


def test_usage_is_forced_upstream_but_only_shown_when_asked(world):
    events = raw_events(world, "quiet [sim deltas=3]")
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert all("usage" not in c and c["choices"] for c in chunks)
    assert world["simulator"].simulator.stats.requests[-1]["body"]["stream_options"] == {"include_usage": True}
    # Charged all the same, from the usage the worker sent the gateway.
    assert UsageRecord.objects.get().completion_tokens == 3


def test_chunks_are_forwarded_as_they_arrive(world):
    started = time.perf_counter()
    stream = sdk(world).chat.completions.create(
        model="acme/model-1", stream=True, messages=[{"role": "user", "content": "slow [sim deltas=5 delay=250]"}]
    )
    first_content = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first_content is None:
            first_content = time.perf_counter() - started
    total = time.perf_counter() - started
    assert first_content is not None
    assert total >= 1.2
    assert first_content < total - 0.8  # the first token came while the worker still had four to go


def test_async_sdk_stream(world):
    async def run() -> str:
        async with openai.AsyncOpenAI(base_url=world["url"] + "/v1", api_key=world["secret"], max_retries=0) as ai:
            stream = await ai.completions.create(model="acme/model-1", prompt="a b [sim deltas=3]", stream=True)
            return "".join([c.choices[0].text async for c in stream if c.choices])

    assert asyncio.run(run()) == "SpeedInfer routes"
    assert UsageRecord.objects.get().completion_tokens == 3


def test_a_stream_without_usage_ends_in_an_error_event_and_charges_nothing(world):
    before = balance(world)
    events = raw_events(world, "[sim no-usage deltas=3]")
    assert b"[DONE]" not in events
    error = orjson.loads(events[-1])["error"]
    assert error["code"] == "runtime_usage_unavailable"
    assert balance(world) == before
    record = UsageRecord.objects.get()
    assert (record.status, record.error_code, record.cost) == ("failed", "runtime_usage_unavailable", 0)

    with pytest.raises(openai.APIError):
        list(
            sdk(world).chat.completions.create(
                model="acme/model-1", stream=True, messages=[{"role": "user", "content": "[sim no-usage]"}]
            )
        )
    assert balance(world) == before


def test_an_upstream_cut_mid_stream_ends_in_an_error_event_and_releases(world):
    before = balance(world)
    events = raw_events(world, "[sim cut=2 deltas=6]")
    assert b"[DONE]" not in events
    assert orjson.loads(events[-1])["error"]["code"] == "upstream_error"
    contents = [orjson.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert contents == ["", "Speed", "Infer"]  # what arrived before the cut was passed on
    assert balance(world) == before
    assert Reservation.objects.get().status == "released"
    assert Worker.objects.get(worker_id="sim-1").consecutive_failures == 1


def _wait_closed(timeout: float = 5.0) -> Reservation:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reservation = Reservation.objects.first()
        if reservation is not None and reservation.status != "held":
            return reservation
        time.sleep(0.05)
    raise AssertionError("the reservation stayed held after the client left")


def test_a_client_leaving_mid_stream_stops_the_worker_and_pays_only_for_what_it_was_sent(world):
    simulator = world["simulator"].simulator
    abandoned = simulator.stats.streams_abandoned
    before = balance(world)
    payload = {
        "model": "acme/model-1",
        "stream": True,
        "messages": [{"role": "user", "content": "long story [sim deltas=40 delay=150]"}],
    }
    seen = 0
    with httpx.stream(
        "POST",
        world["url"] + "/v1/chat/completions",
        json=payload,
        headers={"Authorization": f"Bearer {world['secret']}"},
        timeout=10,
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and orjson.loads(line[6:])["choices"][0]["delta"].get("content"):
                seen += 1
                if seen == 2:
                    break
    reservation = _wait_closed()
    assert reservation.status == "settled"
    record = UsageRecord.objects.get()
    assert record.status == "client_disconnected"
    assert 2 <= record.completion_tokens <= 4  # what was sent before the gateway noticed, not the 40 asked for
    assert record.prompt_tokens == -(-len(b"long story [sim deltas=40 delay=150]") // 4)  # bytes / 4, rounded up
    assert balance(world) == (before[0] - record.cost, 0)
    deadline = time.monotonic() + 5
    while simulator.stats.streams_abandoned == abandoned and time.monotonic() < deadline:
        time.sleep(0.05)
    assert simulator.stats.streams_abandoned == abandoned + 1  # the upstream request was closed
    totals = ledger_totals(account=Account.objects.get(pk=world["account"].pk))
    assert (totals.available, totals.reserved) == balance(world)


def test_a_client_leaving_before_any_content_is_charged_nothing(world):
    before = balance(world)
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream(
            "POST",
            world["url"] + "/v1/chat/completions",
            json={"model": "acme/model-1", "stream": True, "messages": [{"role": "user", "content": "[sim hang]"}]},
            headers={"Authorization": f"Bearer {world['secret']}"},
            timeout=0.5,
        ) as response:
            response.read()
    reservation = _wait_closed()
    assert reservation.status == "released"
    assert UsageRecord.objects.get().error_code == "client_disconnected"
    assert balance(world) == before
