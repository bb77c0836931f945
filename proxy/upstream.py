"""Choosing and calling a worker: select by capability, forward (one retry on another worker while
nothing has reached the client), and the one failure path of a worker call.

Workers are called through `runtimes.client.client_for(worker)` (the interface in runtimes.interface):
this module asks a client what it can do (`capabilities`) and never names a transport.
"""

from __future__ import annotations

import asyncio
import logging
import time

from proxy.billed import BilledCall
from proxy.errors import GatewayError
from runtimes.client import client_for
from runtimes.errors import WorkerError
from runtimes.interface import Answer, WorkerClient
from runtimes.request import EMBEDDINGS, RERANK, RESPONSES, CompletionParams
from runtimes.responses import Untranslatable, chat_request
from workers import prefix, queue, routing
from workers.config import get_routing_config

log = logging.getLogger("speedinfer.gateway")


def prefix_hashes(params: CompletionParams) -> list[int]:
    """The request's prompt blocks for prefix affinity (none for embeddings or other policies)."""
    if params.endpoint == EMBEDDINGS or get_routing_config().policy != "prefix":
        return []
    return prefix.block_hashes(model=params.model, texts=params.texts, cache_key=params.cache_key)


async def select(params: CompletionParams, *, hashes: list[int] | None = None) -> list[WorkerClient]:
    """The eligible workers' clients, in preference order; a stream request keeps those that stream.

    docs/interface.md, HTTP: `stream: true` for a model none of whose workers can stream (direct Triton) is 400
    streaming_unsupported; judged on the eligible workers, else on every worker declaring the model."""
    clients = [client_for(w) for w in await routing.eligible_workers(params.model, prefix_hashes=hashes)]
    if params.endpoint == RESPONSES:
        clients = _responses_clients(params, clients)
    if params.needs:
        clients = await _honouring(params, clients)
    if params.stream:
        streamable = [c for c in clients if c.capabilities.streams]
        if not streamable:
            declared = clients or [client_for(w) for w in await routing.model_workers_async(params.model)]
            if declared and not any(c.capabilities.streams for c in declared):
                raise GatewayError(
                    400,
                    "streaming_unsupported",
                    f"the model '{params.model}' is served by direct Triton workers that do not stream; "
                    "send stream: false",
                    param="stream",
                )
        clients = streamable
    if not clients:
        raise GatewayError(503, "no_healthy_worker", f"no healthy worker serves the model '{params.model}' right now")
    return clients


def _responses_clients(params: CompletionParams, clients: list[WorkerClient]) -> list[WorkerClient]:
    """Who serves a Responses request: the workers that speak the Responses API, when the model has any
    (the body goes as it is); else every text worker through the chat translation, which must then hold
    (400 naming the field it cannot carry) and whose tools / text.format the worker must honour."""
    native = [c for c in clients if c.capabilities.responses]
    if native:
        return native
    try:
        chat = chat_request(params.body)
    except Untranslatable as refused:
        raise GatewayError(400, "invalid_request", str(refused), param=refused.param) from None
    for feature, flag, param in (("tools", "tools", "tools"), ("response_format", "response_format", "text.format")):
        if chat.get(feature) is not None and clients:
            clients = [c for c in clients if getattr(c.capabilities, flag)]
            if not clients:
                raise GatewayError(
                    400,
                    "invalid_request",
                    f"'{param}' is not honoured by the workers serving the model '{params.model}'",
                    param=param,
                )
    return clients


async def _honouring(params: CompletionParams, clients: list[WorkerClient]) -> list[WorkerClient]:
    """The clients whose Capabilities honour every feature the request uses (tools, response_format,
    n, logprobs, media parts); a 400 naming the field when none of the model's workers does
    (docs/interface.md: silent drops are refused), judged on the eligible workers, else on every
    worker declaring the model (all of them unhealthy: a 503 then, not a 400)."""

    def able(client: WorkerClient) -> bool:
        return all(getattr(client.capabilities, flag) for flag in params.needs)

    honouring = [c for c in clients if able(c)]
    if honouring:
        return honouring
    declared = clients or [client_for(w) for w in await routing.model_workers_async(params.model)]
    if declared and not any(able(c) for c in declared):
        missing = [f for f in params.needs if not any(getattr(c.capabilities, f) for c in declared)]
        field = params.needs[(missing or list(params.needs))[0]]
        raise GatewayError(
            400,
            "invalid_request",
            f"'{field}' is not supported by the workers serving the model '{params.model}'",
            param=field,
        )
    return honouring


async def admit(call: BilledCall, *, hashes: list[int]) -> queue.Slot:
    """A capacity slot on one of the selected workers (workers.queue: waiting while the model's pool is
    saturated), before anything is reserved; the slot's worker goes first in `call.clients`, and the
    fallback keeps only workers without a capacity (a retry must not overfill a full one).
    503 overloaded with Retry-After when the request may not wait, or waited too long."""
    candidates = [(c.worker.worker_id, routing.capacity(c.worker.worker_id)) for c in call.clients]
    try:
        slot = await queue.admit(
            model_id=call.params.model, candidates=candidates, account=call.key.account_id, priority=call.key.priority
        )
    except queue.Overloaded as exc:
        raise GatewayError(
            503, "overloaded", str(exc), headers=[(b"retry-after", str(exc.retry_after).encode())]
        ) from None
    chosen = next(c for c in call.clients if c.worker.worker_id == slot.worker_id)
    rest = [c for c in call.clients if c is not chosen and routing.capacity(c.worker.worker_id) is None]
    call.clients = [chosen, *rest]
    call.ex.outcome.queue_wait_ms = round(slot.waited_s * 1000)
    if hashes:
        prefix.record(hashes, slot.worker_id)
    return slot


async def forward_once(call: BilledCall, client: WorkerClient) -> Answer:
    """One non-streaming call to one worker, counted in its in-flight load and latency estimate."""
    params, max_tokens, request_id = call.params, call.max_tokens, call.ex.request_id
    endpoint, caps = params.endpoint, client.capabilities
    serve, capable = {
        EMBEDDINGS: (client.embed, caps.embeds),
        RESPONSES: (client.respond, caps.generates_text),
        RERANK: (client.rerank, caps.rerank),
    }.get(endpoint, (client.complete, caps.generates_text))
    if not capable:
        # Refused by the interface (WorkerRejected) before the worker is counted as called.
        return await serve(params=params, max_tokens=max_tokens, request_id=request_id)
    worker_id = client.worker.worker_id
    span = call.ex.trace.worker_call(worker_id=worker_id, endpoint=params.endpoint, model=params.model)
    params.traceparent = span.traceparent  # the worker's trace joins this call's span
    routing.acquire(worker_id)
    started, failure = time.perf_counter(), "internal_error"
    latency: float | None = None
    try:
        answer = await serve(params=params, max_tokens=max_tokens, request_id=request_id)
        span.first_byte()  # a non-streaming answer arrives whole
        failure = ""
        return answer
    except asyncio.CancelledError:
        failure = "client_disconnected"
        raise  # the client left: says nothing about the worker's speed
    except WorkerError as error:
        failure = error.code
        latency = time.perf_counter() - started
        raise
    except BaseException:
        latency = time.perf_counter() - started
        raise
    finally:
        if not failure:
            latency = time.perf_counter() - started
        routing.release(worker_id, latency=latency, ok=not failure)
        span.end(failure)


async def complete(call: BilledCall) -> None:
    """A non-streaming request: forward, settle from the worker's usage, answer.

    While the worker works, a client that disconnects (or times out) cancels the upstream call at
    once: its connection is closed, so the worker stops (vLLM aborts a request whose client left),
    and nothing is charged (BilledCall.charge_abandoned)."""
    ex = call.ex
    watcher = ex.watch_disconnect()
    try:
        for attempt, client in enumerate(call.clients[:2]):
            worker = call.worker = client.worker
            try:
                if ex.disconnected:
                    raise asyncio.CancelledError
                ex.interruptible = True
                try:
                    data, usage = await forward_once(call, client)
                finally:
                    ex.interruptible = False
            except WorkerError as error:
                await worker_failed(call, client, error, attempt=attempt)
                continue
            await routing.record_success(worker.worker_id)
            call.usage = usage
            await call.settle(usage)
            await ex.respond_json(200, data)
            return
    except asyncio.CancelledError:
        if not ex.disconnected:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        await call.charge_abandoned()
    finally:
        watcher.cancel()
        await call.release("internal_error")  # only if something above raised unexpectedly


async def worker_failed(call: BilledCall, client: WorkerClient, error: WorkerError, *, attempt: int | None) -> None:
    """The one failure path of a worker call: log it, count a worker fault against the circuit, then
    return when the caller may try the next worker (a first attempt whose failure reached no client),
    else release the reservation (nothing is charged) and raise the client's error."""
    worker = client.worker
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
    if error.unreachable:
        routing.mark_unreachable(worker.worker_id)
    if error.counts_against_circuit:
        await routing.record_failure(worker.worker_id, reason=error.code, fingerprint=call.retry_fingerprint())
        if attempt == 0 and len(call.clients) > 1:
            return
    await call.release(error.code)
    headers = None if error.retry_helps else [(b"x-should-retry", b"false")]
    if error.retry_after:
        headers = [*(headers or []), (b"retry-after", str(error.retry_after).encode())]
    raise GatewayError(error.status, error.code, error.message, headers=headers) from None
