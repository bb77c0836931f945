"""POST /v1/chat/completions, /v1/completions and /v1/embeddings: the request path, in docs/interface.md's order.

parse and validate -> authenticate -> scope, model, allow-list -> rate limits
-> streaming support -> select a worker -> reserve -> forward (one retry on
another worker while nothing has reached the client) -> settle -> answer.

Database work is two thread hops per request: one to reserve, one to settle
(or release). Everything else on a warm request is served from memory.

Charging on client disconnect mid-stream (see README, "The API"):
- the worker's usage event had already arrived: settle with it (the client was
  sent all the content);
- no content had been sent yet: release, nothing is charged;
- otherwise: charge what was delivered: one completion token per content
  chunk sent to the client (OpenAI-compatible runtimes stream one token per
  chunk) plus the prompt, estimated at one token per 4 bytes of prompt text
  (capped by the reserved bound), since the worker had processed all of it.
  The upstream request is closed at once, so the worker stops generating.

A worker that fails or times out mid-stream gets an error event and nothing is
charged (docs/interface.md, Errors: upstream_timeout / upstream_error). Streams have the worker's
total timeout over the whole stream and its read timeout between data events
(SSE comments are not progress), before the first event included.

The reservation is leased while the request runs (renewed every
billing.services.LEASE_RENEW_EVERY), so the sweeper never frees a running
request's hold; a settle that finds it expired anyway still charges.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from accounts.key_cache import KeyInfo
from accounts.selectors import api_key_authenticate_async
from billing.models import UsageRecord
from billing.pricing import cost_of, prompt_token_bound
from billing.services import (
    LEASE_RENEW_EVERY,
    InsufficientCredits,
    KeyBudgetExceeded,
    reservation_release_async,
    reservation_renew_async,
    reservation_settle_async,
)
from catalog import cache as catalog
from catalog.models import PublicModel
from core.metrics import observe_spend, observe_uncharged_overrun
from core.outages import DatabaseUnavailable
from core.outcome import RequestOutcome
from proxy.embeddings import parse_embeddings
from proxy.errors import GatewayError
from proxy.exchange import Exchange
from proxy.idempotency import idempotency_begin, idempotency_end, idempotency_key, idempotency_replay
from proxy.payloads import parse_completion
from proxy.pending import pending_close
from proxy.ratelimit import rate_limit_admit, rate_limit_refund
from proxy.services import request_reserve
from runtimes.embeddings import generates_text, openai_embed, triton_embed
from runtimes.errors import RuntimeUsageUnavailable, UpstreamError, UpstreamTimeout, WorkerError, WorkerRejected
from runtimes.http import worker_timeout, worker_total_timeout
from runtimes.openai import openai_complete, openai_stream_open
from runtimes.request import EMBEDDINGS, CompletionParams, Usage, usage_from
from runtimes.sse import DONE, sse_data
from runtimes.target import WorkerTarget
from runtimes.triton import triton_complete
from runtimes.triton_stream import triton_stream_chunks, triton_stream_complete, triton_stream_open, triton_streams
from workers import routing

log = logging.getLogger("speedinfer.gateway")

_ENDPOINT_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", EMBEDDINGS: "/v1/embeddings"}


async def authenticate(ex: Exchange, scope: str) -> KeyInfo:
    """The request's key with `scope`, or 401 invalid_api_key / 403 insufficient_scope."""
    result = await api_key_authenticate_async(raw_key=ex.bearer())
    key = result.key
    if key is not None:
        ex.outcome.account_id, ex.outcome.key_prefix = key.account_id, key.prefix
    if key is None:
        reason = {"missing": "no API key was given (Authorization: Bearer ...)"}.get(
            result.reason or "", f"the API key is {result.reason or 'unknown'}"
        )
        raise GatewayError(401, "invalid_api_key", reason)
    if scope not in key.scopes:
        raise GatewayError(403, "insufficient_scope", f"this key lacks the '{scope}' scope")
    return key


@dataclass
class _Call:
    """Everything one completion request carries through the path."""

    ex: Exchange
    params: CompletionParams
    key: KeyInfo
    model: PublicModel
    max_tokens: int
    prompt_bound: int
    workers: list[WorkerTarget] = field(default_factory=list)
    reservation_id: Any = None
    worker: WorkerTarget | None = None
    usage: Usage | None = None
    delivered_chunks: int = 0
    closed: bool = False  # the reservation was settled or released
    settled: bool = False  # ... and the request was charged

    def _outcome(self) -> RequestOutcome:
        outcome = self.ex.outcome
        outcome.worker_id = self.worker.worker_id if self.worker else ""
        outcome.endpoint = _ENDPOINT_PATHS[self.params.endpoint]
        return outcome

    async def settle(self, usage: Usage, status: str = UsageRecord.Status.OK) -> None:
        outcome = self._outcome()

        async def close() -> object:
            record = await reservation_settle_async(
                reservation_id=self.reservation_id,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                outcome=outcome,
                status=status,
            )
            if record is not None:
                observe_spend(record.model_id, record.cost)
                if record.uncharged:
                    observe_uncharged_overrun(worker_id=record.worker_id, micro_credits=record.uncharged)
            return record

        await _close_or_queue("settle", self.reservation_id, close)
        # Closed once the settle committed (or was queued until the database is back): a settle that
        # raised otherwise leaves the hold to release(), so nothing stays held.
        self.closed = self.settled = True

    async def release(self, error_code: str) -> None:
        if self.closed or self.reservation_id is None:
            return
        self.closed = True
        outcome = self._outcome()

        def close() -> Awaitable[object]:
            return reservation_release_async(reservation_id=self.reservation_id, error_code=error_code, outcome=outcome)

        await _close_or_queue("release", self.reservation_id, close)


async def _close_or_queue(what: str, reservation_id: object, close: Callable[[], Awaitable[object]]) -> None:
    """Settle or release now; with the database unreachable, queue it (proxy.pending) and go on: the
    worker's answer still reaches the client, and the close is written as soon as the database is back."""
    try:
        await close()
    except DatabaseUnavailable:
        pending_close(what=what, reservation_id=reservation_id, close=close)


async def handle_completion(ex: Exchange, endpoint: str) -> None:
    body = await ex.body()
    params = parse_embeddings(body) if endpoint == EMBEDDINGS else parse_completion(body, endpoint=endpoint)
    ex.outcome.model, ex.outcome.streamed = params.model, params.stream
    idempotency_key(ex)  # a malformed key is a 400 before anything else is looked at
    key = await authenticate(ex, endpoint)  # the scope names match the endpoints: chat, completions, embeddings
    claim = await idempotency_begin(ex, key=key, body=body)
    if claim is None:
        await _serve(ex, params, key, [])
        return
    if claim.verdict == "replay":
        await idempotency_replay(ex, claim)
        return
    calls: list[_Call] = []
    try:
        await _serve(ex, params, key, calls)
    finally:
        await idempotency_end(ex, claim, charged=bool(calls) and calls[0].settled)


async def _serve(ex: Exchange, params: CompletionParams, key: KeyInfo, calls: list[_Call]) -> None:
    """Everything after authentication; the _Call goes into `calls` as soon as it exists."""
    endpoint = params.endpoint
    model = (await catalog.public_models()).get(params.model)
    if model is None:
        raise GatewayError(404, "model_not_found", f"the model '{params.model}' does not exist", param="model")
    if key.allowed_models and params.model not in key.allowed_models:
        raise GatewayError(403, "model_not_allowed", f"this key may not use the model '{params.model}'", param="model")
    cap = model.max_output_tokens
    max_tokens = min(params.max_tokens, cap) if params.max_tokens else cap
    if endpoint == EMBEDDINGS:
        max_tokens = 0  # embeddings produce no tokens: the reservation is the input's bound at the input price
    prompt_bound = prompt_token_bound(texts=params.texts, messages=len(params.messages))
    token_bound = prompt_bound + max_tokens

    decision = await rate_limit_admit(key=key, tokens=token_bound)
    ex.extra_headers = decision.headers(key)
    if not decision.allowed:
        raise GatewayError(429, "rate_limit_exceeded", "rate limit exceeded for this key; retry after the given time")

    call = _Call(ex=ex, params=params, key=key, model=model, max_tokens=max_tokens, prompt_bound=prompt_bound)
    calls.append(call)
    lease: asyncio.Task[None] | None = None
    try:
        call.workers = await _select(params)
        await _reserve_for(call)
        lease = asyncio.create_task(_keep_lease(call.reservation_id))
        if params.stream:
            await _stream(call)
        else:
            await _complete(call)
    finally:
        if lease is not None:
            lease.cancel()
        outcome = ex.outcome
        outcome.worker_id = call.worker.worker_id if call.worker else ""
        if call.usage is not None:
            outcome.prompt_tokens, outcome.completion_tokens = call.usage.prompt_tokens, call.usage.completion_tokens
        # The tokens limit counts what was used, not the bound it admitted.
        used = outcome.prompt_tokens + outcome.completion_tokens if call.closed and call.usage is not None else 0
        await rate_limit_refund(key=key, tokens=token_bound - used)


async def _keep_lease(reservation_id: Any) -> None:
    """Renew the running request's reservation lease until cancelled (the request ended) or closed."""
    every = LEASE_RENEW_EVERY.total_seconds()
    while True:
        await asyncio.sleep(every)
        try:
            if not await reservation_renew_async(reservation_id=reservation_id):
                return
        except Exception:  # a database blip: the lease has room for the next try
            log.warning("could not renew the lease of reservation %s", reservation_id, exc_info=True)


async def _select(params: CompletionParams) -> list[WorkerTarget]:
    workers = await routing.eligible_workers(params.model)
    if params.stream:
        streamable = [w for w in workers if w.transport == "openai" or triton_streams(w)]
        if not streamable:
            declared = {w.transport for w in workers} or await routing.model_transports_async(params.model)
            if declared and "openai" not in declared:
                raise GatewayError(
                    400,
                    "streaming_unsupported",
                    f"the model '{params.model}' is served by direct Triton workers that do not stream; "
                    "send stream: false",
                    param="stream",
                )
        workers = streamable
    if not workers:
        raise GatewayError(503, "no_healthy_worker", f"no healthy worker serves the model '{params.model}' right now")
    return workers


async def _reserve_for(call: _Call) -> None:
    amount = cost_of(
        prompt_tokens=call.prompt_bound,
        completion_tokens=call.max_tokens,
        input_price=call.model.input_price,
        output_price=call.model.output_price,
    )
    try:
        reservation = await request_reserve(
            key=call.key,
            model=call.model,
            amount=max(1, amount),  # a free model still holds a token micro-credit, so it settles like any other
            request_id=call.ex.request_id,
        )
    except InsufficientCredits as exc:
        raise GatewayError(402, "insufficient_credits", f"insufficient credits: {exc}") from None
    except KeyBudgetExceeded as exc:
        raise GatewayError(402, "key_budget_exceeded", str(exc)) from None
    call.reservation_id = reservation.pk


async def _forward_once(call: _Call, worker: WorkerTarget) -> tuple[dict[str, Any], Usage]:
    if call.params.endpoint == EMBEDDINGS:
        forward = openai_embed if worker.transport == "openai" else triton_embed
    elif triton_streams(worker):
        forward = triton_stream_complete  # its model is decoupled: /infer would refuse it
    elif generates_text(worker):
        forward = openai_complete if worker.transport == "openai" else triton_complete
    else:
        raise WorkerRejected(f"the model '{call.params.model}' serves embeddings only (POST /v1/embeddings)")
    routing.acquire(worker.worker_id)
    started, ok = time.perf_counter(), False
    try:
        answer = await forward(
            worker=worker, params=call.params, max_tokens=call.max_tokens, request_id=call.ex.request_id
        )
        ok = True
        return answer
    finally:
        routing.release(worker.worker_id, latency=time.perf_counter() - started, ok=ok)


async def _complete(call: _Call) -> None:
    try:
        for attempt, worker in enumerate(call.workers[:2]):
            call.worker = worker
            try:
                data, usage = await _forward_once(call, worker)
            except WorkerError as error:
                await _worker_failed(call, worker, error, attempt=attempt)
                continue
            await routing.record_success(worker.worker_id)
            call.usage = usage
            await call.settle(usage)
            await call.ex.respond_json(200, data)
            return
    finally:
        await call.release("internal_error")  # only if something above raised unexpectedly


async def _stream(call: _Call) -> None:
    ex = call.ex
    watcher = ex.watch_disconnect()
    response: httpx.Response | None = None
    events = None
    counted: str | None = None  # the worker whose in-flight count this stream holds
    loop = asyncio.get_running_loop()
    try:
        ex.interruptible = True
        first: bytes | None = None
        for attempt, worker in enumerate(call.workers[:2]):
            call.worker = worker
            if counted is not None:
                routing.release(counted)
            routing.acquire(worker.worker_id)
            counted = worker.worker_id
            try:
                deadline = loop.time() + worker_total_timeout(worker.runtime_config)
                response, events = await _stream_open(call, worker)
                # Headers from the worker are not an answer: until its first data event the client has
                # none either, so the read timeout applies to that event (comments don't reset it).
                first = await _next_event(events, worker, deadline)
                if first is None:
                    raise RuntimeUsageUnavailable("the worker's stream ended without any event; nothing was charged")
                break
            except WorkerError as error:
                if response is not None:
                    await response.aclose()
                    response = None
                ex.interruptible = False
                await _worker_failed(call, worker, error, attempt=attempt)
                ex.interruptible = True
                continue
        assert response is not None and events is not None and first is not None
        ex.outcome.ttft = ex.outcome.elapsed()
        await ex.start_stream()
        await _relay(call, first, events, response, deadline)
    except asyncio.CancelledError:
        if not ex.disconnected:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        ex.interruptible = False
        if response is not None:
            await response.aclose()
            response = None
        await _charge_disconnected(call)
    finally:
        ex.interruptible = False
        watcher.cancel()
        if counted is not None:
            # The balancer learns a stream's time to its first event (from the request's start).
            routing.release(counted, latency=ex.outcome.ttft)
        if response is not None:
            await response.aclose()
        await call.release("internal_error")  # only if something above raised unexpectedly


async def _stream_open(call: _Call, worker: WorkerTarget) -> tuple[httpx.Response, AsyncIterator[bytes]]:
    """The upstream stream and its OpenAI chunk payloads, for either transport."""
    params, max_tokens, request_id = call.params, call.max_tokens, call.ex.request_id
    if worker.transport == "openai":
        response = await openai_stream_open(worker=worker, params=params, max_tokens=max_tokens, request_id=request_id)
        return response, sse_data(response)
    response = await triton_stream_open(worker=worker, params=params, max_tokens=max_tokens, request_id=request_id)
    return response, triton_stream_chunks(response, worker=worker, params=params, max_tokens=max_tokens)


async def _next_event(events: Any, worker: WorkerTarget, deadline: float) -> bytes | None:
    """The next data event, within the worker's read timeout and the stream's total deadline."""
    loop = asyncio.get_running_loop()
    idle = worker_timeout(worker.runtime_config).read or worker_total_timeout(worker.runtime_config)
    by_idle = loop.time() + idle
    try:
        async with asyncio.timeout_at(min(by_idle, deadline)):
            payload: bytes | None = await anext(events, None)
            return payload
    except TimeoutError:
        what = "ran past its total timeout" if deadline <= by_idle else f"sent no data event for {idle:g} s"
        raise UpstreamTimeout(f"the worker {what}; nothing was charged") from None


async def _relay(call: _Call, first: bytes, events: Any, response: httpx.Response, deadline: float) -> None:
    """Forward each upstream event as it arrives; settle on the usage event's authority; end with [DONE]."""
    ex = call.ex
    public_model = call.params.model
    include_usage = call.params.include_usage
    worker = call.worker
    assert worker is not None
    payload: bytes | None = first
    try:
        while payload is not None:
            if payload == DONE:
                break
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:
                raise UpstreamError(
                    "the worker sent an event that is not JSON", detail=payload[:200].decode()
                ) from None
            if not isinstance(chunk, dict) or "error" in chunk:
                raise UpstreamError("the worker reported an error mid-stream", detail=payload[:500].decode())
            usage = usage_from(chunk.get("usage"))
            if usage is not None:
                call.usage = usage
            choices = chunk.get("choices")
            if choices or include_usage:
                chunk["model"] = public_model
                if not include_usage:
                    chunk.pop("usage", None)
                if ex.disconnected:
                    raise asyncio.CancelledError
                await ex.send_chunk(b"data: " + orjson.dumps(chunk) + b"\n\n")
                if choices and _has_content(choices[0]):
                    call.delivered_chunks += 1
            payload = await _next_event(events, worker, deadline)
        if call.usage is None:
            raise RuntimeUsageUnavailable("the worker's stream ended without usage; nothing was charged")
    except WorkerError as error:
        ex.interruptible = False
        await response.aclose()
        try:
            await _worker_failed(call, worker, error, attempt=None)
        except GatewayError as failure:
            # The 200 is already sent: the error goes in the stream, and the record keeps the real status.
            ex.outcome.status, ex.outcome.error_code = failure.status, failure.code
            await ex.end_stream(b"data: " + orjson.dumps(failure.body()) + b"\n\n")
        return
    ex.interruptible = False
    await routing.record_success(worker.worker_id)
    await call.settle(call.usage)
    await ex.end_stream(b"data: [DONE]\n\n")
    # Read the upstream body to its end (after [DONE] only the chunked terminator is left): a response
    # closed before its end takes its connection down with it, and the next stream would open a new one.
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1):
            async for _ in events:
                pass


def _has_content(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("tool_calls") or delta.get("function_call"))
    return bool(choice.get("text"))


async def _charge_disconnected(call: _Call) -> None:
    """The client left mid-stream: charge what it was sent, nothing more (policy in the module docstring)."""
    status = UsageRecord.Status.CLIENT_DISCONNECTED
    call.ex.outcome.status = 499
    if call.usage is not None:
        await call.settle(call.usage, status)
    elif call.delivered_chunks == 0:
        await call.release("client_disconnected")
    else:
        prompt_bytes = sum(len(t.encode()) for t in call.params.texts)
        prompt = min(call.prompt_bound, math.ceil(prompt_bytes / 4))
        completion = min(call.max_tokens, call.delivered_chunks)
        await call.settle(Usage(prompt, completion), status)
    log.info("request %s: client disconnected mid-stream after %d chunks", call.ex.request_id, call.delivered_chunks)


async def _worker_failed(call: _Call, worker: WorkerTarget, error: WorkerError, *, attempt: int | None) -> None:
    """The one failure path of a worker call: log it, count a worker fault against the circuit, then
    return when the caller may try the next worker (a first attempt whose failure reached no client),
    else release the reservation (nothing is charged) and raise the client's error."""
    _log_worker_error(call, worker, error)
    if error.unreachable:
        routing.mark_unreachable(worker.worker_id)
    if error.counts_against_circuit:
        await routing.record_failure(worker.worker_id, reason=error.code)
        if attempt == 0 and len(call.workers) > 1:
            return
    await call.release(error.code)
    raise GatewayError(error.status, error.code, error.message) from None


def _log_worker_error(call: _Call, worker: WorkerTarget, error: WorkerError) -> None:
    # The worker's own words may quote its URL; endpoints never reach the logs.
    detail = error.detail.replace(worker.endpoint, "<endpoint>") if worker.endpoint else error.detail
    log.warning(
        "request %s: worker %s failed: %s (%s) %s",
        call.ex.request_id,
        worker.worker_id,
        error.code,
        error.message,
        detail,
    )
