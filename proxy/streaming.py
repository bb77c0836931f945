"""`stream: true`: open the upstream stream (one retry on another worker before the first event), relay
each event as it arrives, settle on the usage event's authority, end with [DONE].

Every transport's stream is the same to this module: `WorkerClient.stream_open` yields OpenAI chunk
payloads (runtimes.interface). A worker that fails or times out mid-stream gets an error event and
nothing is charged (docs/interface.md, Errors: upstream_timeout / upstream_error). Streams have the worker's total
timeout over the whole stream and its read timeout between data events (SSE comments are not
progress), before the first event included. A client that disconnects is charged by
BilledCall.charge_disconnected, and the upstream request is closed at once, so the worker stops generating.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import orjson

from proxy.billed import BilledCall
from proxy.errors import GatewayError
from proxy.tracing import NO_WORKER_SPAN, WorkerSpan
from proxy.upstream import worker_failed
from runtimes.errors import RuntimeUsageUnavailable, UpstreamError, UpstreamTimeout, WorkerError
from runtimes.interface import DONE, WorkerClient, WorkerStream
from runtimes.request import RESPONSES, Usage, usage_from
from runtimes.responses import usage_of_response
from workers import routing


async def stream(call: BilledCall) -> None:
    ex = call.ex
    watcher = ex.watch_disconnect()
    upstream: WorkerStream | None = None
    client: WorkerClient | None = None
    counted: str | None = None  # the worker whose in-flight count this stream holds
    span = NO_WORKER_SPAN  # the trace's span of the current attempt
    loop = asyncio.get_running_loop()
    try:
        ex.interruptible = True
        first: bytes | None = None
        for attempt, client in enumerate(call.clients[:2]):
            worker = call.worker = client.worker
            if counted is not None:
                routing.release(counted)
            routing.acquire(worker.worker_id)
            counted = worker.worker_id
            span = ex.trace.worker_call(
                worker_id=worker.worker_id, endpoint=call.params.endpoint, model=call.params.model
            )
            call.params.traceparent = span.traceparent  # the worker's trace joins this attempt's span
            try:
                deadline = loop.time() + client.total_timeout
                open_stream = client.respond_stream if call.params.endpoint == RESPONSES else client.stream_open
                upstream = await open_stream(params=call.params, max_tokens=call.max_tokens, request_id=ex.request_id)
                # Headers from the worker are not an answer: until its first data event the client has
                # none either, so the read timeout applies to that event (comments don't reset it).
                first = await _next_event(upstream, client, deadline)
                if first is None:
                    raise RuntimeUsageUnavailable("the worker's stream ended without any event; nothing was charged")
                span.first_byte()
                break
            except WorkerError as error:
                span.end(error.code)
                if upstream is not None:
                    await upstream.aclose()
                    upstream = None
                ex.interruptible = False
                await worker_failed(call, client, error, attempt=attempt)
                ex.interruptible = True
                continue
        assert upstream is not None and client is not None and first is not None
        ex.outcome.ttft = ex.outcome.elapsed()
        await ex.start_stream()
        relay = _relay_events if call.params.endpoint == RESPONSES else _relay
        await relay(call, client, first, upstream, deadline, span)
    except asyncio.CancelledError:
        if not ex.disconnected:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        ex.interruptible = False
        if upstream is not None:
            await upstream.aclose()
            upstream = None
        await call.charge_disconnected()
    finally:
        ex.interruptible = False
        watcher.cancel()
        if counted is not None:
            # The balancer learns a stream's time to its first event (from the request's start).
            routing.release(counted, latency=ex.outcome.ttft)
        if upstream is not None:
            await upstream.aclose()
        span.end(ex.outcome.error_code)  # the stream's end (a failure mid-stream set the code)
        await call.release("internal_error")  # only if something above raised unexpectedly


async def _next_event(upstream: WorkerStream, client: WorkerClient, deadline: float) -> bytes | None:
    """The next data event, within the worker's read timeout and the stream's total deadline."""
    loop = asyncio.get_running_loop()
    idle = client.idle_timeout
    by_idle = loop.time() + idle
    try:
        async with asyncio.timeout_at(min(by_idle, deadline)):
            payload: bytes | None = await anext(upstream.payloads, None)
            return payload
    except TimeoutError:
        what = "ran past its total timeout" if deadline <= by_idle else f"sent no data event for {idle:g} s"
        raise UpstreamTimeout(f"the worker {what}; nothing was charged") from None


async def _relay(
    call: BilledCall, client: WorkerClient, first: bytes, upstream: WorkerStream, deadline: float, span: WorkerSpan
) -> None:
    """Forward each upstream event as it arrives; settle on the usage event's authority; end with [DONE]."""
    ex = call.ex
    public_model = call.params.model
    include_usage = call.params.include_usage
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
                call.note_sent(choices)
            payload = await _next_event(upstream, client, deadline)
        span.end()  # the worker's last event
        if call.usage is None:
            raise RuntimeUsageUnavailable("the worker's stream ended without usage; nothing was charged")
    except WorkerError as error:
        await _failed_mid_stream(
            call, client, upstream, span, error, lambda failure: b"data: " + orjson.dumps(failure.body()) + b"\n\n"
        )
        return
    await _completed(call, client, upstream, call.usage, b"data: [DONE]\n\n")


async def _failed_mid_stream(
    call: BilledCall,
    client: WorkerClient,
    upstream: WorkerStream,
    span: WorkerSpan,
    error: WorkerError,
    frame: Callable[[GatewayError], bytes],
) -> None:
    """The worker failed after the 200 was sent: its failure path runs as before the stream, and the
    client's error goes in the stream as `frame(failure)` (the record keeps the real status)."""
    span.end(error.code)
    call.ex.interruptible = False
    await upstream.aclose()
    try:
        await worker_failed(call, client, error, attempt=None)
    except GatewayError as failure:
        call.ex.outcome.status, call.ex.outcome.error_code = failure.status, failure.code
        await call.ex.end_stream(frame(failure))


async def _completed(call: BilledCall, client: WorkerClient, upstream: WorkerStream, usage: Usage, last: bytes) -> None:
    """The stream ended with usage: settle on it, send `last`, and drain the upstream body."""
    call.ex.interruptible = False
    await routing.record_success(client.worker.worker_id)
    await call.settle(usage)
    await call.ex.end_stream(last)
    # Read the upstream body to its end (after the last event only the chunked terminator is left): a
    # response closed before its end takes its connection down with it, and the next stream opens a new one.
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1):
            async for _ in upstream.payloads:
                pass


# The Responses events that carry generated tokens (what a client that leaves mid-stream pays for).
_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.refusal.delta",
    }
)
_FINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


async def _relay_events(
    call: BilledCall, client: WorkerClient, first: bytes, upstream: WorkerStream, deadline: float, span: WorkerSpan
) -> None:
    """The Responses API's stream: each event as `event: TYPE` + `data: JSON` (no [DONE]: the stream ends
    after response.completed), the usage of its final event settling it; otherwise as _relay."""
    ex = call.ex
    payload: bytes | None = first
    sequence = -1  # the last event's sequence_number: an error event follows it
    try:
        while payload is not None and payload != DONE:
            try:
                event = orjson.loads(payload)
            except orjson.JSONDecodeError:
                raise UpstreamError(
                    "the worker sent an event that is not JSON", detail=payload[:200].decode()
                ) from None
            if not isinstance(event, dict) or "error" in event or event.get("type") == "error":
                raise UpstreamError("the worker reported an error mid-stream", detail=payload[:500].decode())
            kind = str(event.get("type", ""))
            if type(event.get("sequence_number")) is int:
                sequence = event["sequence_number"]
            response = event.get("response")
            if isinstance(response, dict):
                response["model"] = call.params.model
                if kind in _FINAL:
                    call.usage = usage_of_response(response) or call.usage
            if ex.disconnected:
                raise asyncio.CancelledError
            await ex.send_chunk(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n")
            if kind in _DELTAS:
                call.delivered_chunks += 1
            payload = await _next_event(upstream, client, deadline)
        span.end()  # the worker's last event
        if call.usage is None:
            raise RuntimeUsageUnavailable("the worker's stream ended without usage; nothing was charged")
    except WorkerError as error:

        def error_event(failure: GatewayError) -> bytes:
            # The Responses API's error event (the SDK raises it as an APIError).
            event = {
                "type": "error",
                "code": failure.code,
                "message": failure.message,
                "param": failure.param,
                "sequence_number": sequence + 1,
            }
            return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"

        await _failed_mid_stream(call, client, upstream, span, error, error_event)
        return
    await _completed(call, client, upstream, call.usage, b"")
