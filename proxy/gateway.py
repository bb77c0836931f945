"""POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses and /v1/rerank: the request path,
in the documented order.

parse and validate -> authenticate -> scope, model, allow-list -> rate limits
-> select workers by capability (streaming support) and prefix affinity -> a capacity slot (waiting
while the model's pool is saturated: workers.queue) -> reserve -> forward (one retry on another worker
while nothing has reached the client) -> settle -> answer.

Each step past the rate limits lives in its own module:
- proxy.upstream: select (by `WorkerClient.capabilities`), forward a non-streaming call, the one
  failure path of a worker call;
- proxy.streaming: open, relay and close a stream;
- proxy.billed: the billed call (reserve, lease, settle or release, queue on outage, disconnect charging).
Workers are called only through runtimes.interface (`runtimes.client.client_for`): no transport is named here.

Database work is two thread hops per request: one to reserve, one to settle
(or release). Everything else on a warm request is served from memory.
"""

from __future__ import annotations

from accounts.key_cache import KeyInfo
from catalog import cache as catalog
from proxy import leases
from proxy.auth import authenticate
from proxy.billed import BilledCall
from proxy.embeddings import parse_embeddings
from proxy.errors import GatewayError
from proxy.exchange import Exchange
from proxy.idempotency import idempotency_begin, idempotency_end, idempotency_key, idempotency_replay
from proxy.payloads import parse_completion
from proxy.ratelimit import rate_limit_admit, rate_limit_refund_soon
from proxy.responses import parse_rerank, parse_responses
from proxy.streaming import stream
from proxy.upstream import admit, complete, prefix_hashes, select
from runtimes.request import EMBEDDINGS, ENDPOINT_PATHS, RERANK, RESPONSES, CompletionParams

CLAMPED_HEADER = b"x-speedinfer-max-tokens-clamped"
_PARSERS = {EMBEDDINGS: parse_embeddings, RESPONSES: parse_responses, RERANK: parse_rerank}
# The scope names match the endpoints (chat, completions, embeddings) but for these two.
_SCOPES = {RESPONSES: "chat", RERANK: "embeddings"}


async def handle_completion(ex: Exchange, endpoint: str) -> None:
    body = await ex.body()
    parse = _PARSERS.get(endpoint)
    params = parse(body) if parse is not None else parse_completion(body, endpoint=endpoint)
    ex.outcome.model, ex.outcome.streamed = params.model, params.stream
    idempotency_key(ex)  # a malformed key is a 400 before anything else is looked at
    key = await authenticate(ex, _SCOPES.get(endpoint, endpoint))
    claim = await idempotency_begin(ex, key=key, body=body)
    if claim is None:
        await _serve(ex, params, key, [])
        return
    if claim.verdict == "replay":
        await idempotency_replay(ex, claim)
        return
    calls: list[BilledCall] = []
    try:
        await _serve(ex, params, key, calls)
    finally:
        await idempotency_end(ex, claim, charged=bool(calls) and calls[0].settled)


async def _serve(ex: Exchange, params: CompletionParams, key: KeyInfo, calls: list[BilledCall]) -> None:
    """Everything after authentication; the BilledCall goes into `calls` as soon as it exists."""
    model = (await catalog.public_models()).get(params.model)
    if model is None:
        raise GatewayError(404, "model_not_found", f"the model '{params.model}' does not exist", param="model")
    if key.allowed_models and params.model not in key.allowed_models:
        raise GatewayError(403, "model_not_allowed", f"this key may not use the model '{params.model}'", param="model")
    if not model.serves(params.endpoint):
        raise GatewayError(
            400,
            "invalid_request",
            f"the model '{params.model}' is a {model.kind} model: it does not serve {ENDPOINT_PATHS[params.endpoint]}",
            param="model",
        )
    call = BilledCall.for_request(ex=ex, params=params, key=key, model=model)
    token_bound = call.token_bound

    with ex.trace.step("rate_limit"):
        decision = await rate_limit_admit(key=key, tokens=token_bound)
        ex.extra_headers = decision.headers(key)
        if params.max_tokens is not None and params.max_tokens > call.max_tokens and call.max_tokens:
            # A limit above the model's cap is clamped, and the answer says so (docs/api.md, Request path).
            ex.extra_headers.append((CLAMPED_HEADER, str(call.max_tokens).encode()))
        if not decision.allowed:
            raise GatewayError(
                429, "rate_limit_exceeded", "rate limit exceeded for this key; retry after the given time"
            )

    calls.append(call)
    slot = None
    try:
        hashes = prefix_hashes(params)
        call.clients = await select(params, hashes=hashes)
        # The slot before the reservation: a request that waits for capacity and never runs holds no
        # credits (docs/scheduler.md).
        with ex.trace.step("queue_wait"):
            slot = await admit(call, hashes=hashes)
        with ex.trace.step("reserve"):
            await call.reserve()
        leases.hold(call.reservation_id)
        if params.stream:
            await stream(call)
        else:
            await complete(call)
    finally:
        if call.reservation_id is not None:
            leases.drop(call.reservation_id)
        if slot is not None:
            slot.release()
        outcome = ex.outcome
        outcome.worker_id = call.worker.worker_id if call.worker else ""
        if call.usage is not None:
            outcome.prompt_tokens, outcome.completion_tokens = call.usage.prompt_tokens, call.usage.completion_tokens
        # The tokens limit counts what was used, not the bound it admitted.
        used = outcome.prompt_tokens + outcome.completion_tokens if call.closed and call.usage is not None else 0
        rate_limit_refund_soon(key=key, tokens=token_bound - used)
