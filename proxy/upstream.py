"""Choosing and calling a worker: select by capability, forward (one retry on another worker while
nothing has reached the client), and the one failure path of a worker call.

Workers are called through `runtimes.client.client_for(worker)` (the interface in runtimes.interface):
this module asks a client what it can do (`capabilities`) and never names a transport.
"""

from __future__ import annotations

import logging
import time

from proxy.billed import BilledCall
from proxy.errors import GatewayError
from runtimes.client import client_for
from runtimes.errors import WorkerError
from runtimes.interface import Answer, WorkerClient
from runtimes.request import EMBEDDINGS, CompletionParams
from workers import routing

log = logging.getLogger("speedinfer.gateway")


async def select(params: CompletionParams) -> list[WorkerClient]:
    """The eligible workers' clients, in preference order; a stream request keeps those that stream.

    docs/interface.md, HTTP: `stream: true` for a model none of whose workers can stream (direct Triton) is 400
    streaming_unsupported; judged on the eligible workers, else on every worker declaring the model."""
    clients = [client_for(w) for w in await routing.eligible_workers(params.model)]
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


async def forward_once(call: BilledCall, client: WorkerClient) -> Answer:
    """One non-streaming call to one worker, counted in its in-flight load and latency estimate."""
    params, max_tokens, request_id = call.params, call.max_tokens, call.ex.request_id
    embeddings = params.endpoint == EMBEDDINGS
    serve = client.embed if embeddings else client.complete
    if not (client.capabilities.embeds if embeddings else client.capabilities.generates_text):
        # Refused by the interface (WorkerRejected) before the worker is counted as called.
        return await serve(params=params, max_tokens=max_tokens, request_id=request_id)
    worker_id = client.worker.worker_id
    routing.acquire(worker_id)
    started, ok = time.perf_counter(), False
    try:
        answer = await serve(params=params, max_tokens=max_tokens, request_id=request_id)
        ok = True
        return answer
    finally:
        routing.release(worker_id, latency=time.perf_counter() - started, ok=ok)


async def complete(call: BilledCall) -> None:
    """A non-streaming request: forward, settle from the worker's usage, answer."""
    try:
        for attempt, client in enumerate(call.clients[:2]):
            worker = call.worker = client.worker
            try:
                data, usage = await forward_once(call, client)
            except WorkerError as error:
                await worker_failed(call, client, error, attempt=attempt)
                continue
            await routing.record_success(worker.worker_id)
            call.usage = usage
            await call.settle(usage)
            await call.ex.respond_json(200, data)
            return
    finally:
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
        await routing.record_failure(worker.worker_id, reason=error.code)
        if attempt == 0 and len(call.clients) > 1:
            return
    await call.release(error.code)
    headers = [(b"retry-after", str(error.retry_after).encode())] if error.retry_after else None
    raise GatewayError(error.status, error.code, error.message, headers=headers) from None
