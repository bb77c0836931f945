"""The /v1 API as a lean ASGI application, mounted in front of Django by speedinfer.asgi.

No Django request, URL resolver or middleware runs for /v1: a request is
routed by exact path here (and /v1/models/{id} by its prefix: model ids
contain `/`), and touches Django only for the ORM work it needs (two thread
hops for a completion, none for authentication on a warm key).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from accounts.selectors import api_key_authenticate_async
from catalog import cache as catalog
from catalog.models import PublicModel
from core import state
from core.credits import format_credits
from core.db import db_call
from core.metrics import observe_request
from core.outages import DB_ERRORS, DatabaseUnavailable, RedisUnavailable
from core.outcome import RequestOutcome
from core.refusals import is_refusal, note_refusal
from core.request_log import log_request
from proxy.auth import authenticate
from proxy.billed import start_journal_replay
from proxy.errors import GatewayError
from proxy.exchange import Exchange, Receive, Scope, Send
from proxy.gateway import handle_completion
from proxy.selectors import key_summary, usage_page
from proxy.tracing import configure as configure_tracing
from proxy.tracing import request_trace
from runtimes.request import CHAT, COMPLETIONS, EMBEDDINGS, RERANK, RESPONSES

log = logging.getLogger("speedinfer.gateway")

Handler = Callable[[Exchange], Awaitable[None]]
MODEL_PREFIX = "/v1/models/"
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_key_summary = db_call(key_summary)
_usage_page = db_call(usage_page)


async def chat_completions(ex: Exchange) -> None:
    await handle_completion(ex, CHAT)


async def completions(ex: Exchange) -> None:
    await handle_completion(ex, COMPLETIONS)


async def embeddings(ex: Exchange) -> None:
    await handle_completion(ex, EMBEDDINGS)


async def responses(ex: Exchange) -> None:
    await handle_completion(ex, RESPONSES)


async def rerank(ex: Exchange) -> None:
    await handle_completion(ex, RERANK)


def model_object(model: PublicModel) -> dict[str, object]:
    """OpenAI's model object, with SpeedInfer's prices (credits per 1,000,000 tokens) and output cap."""
    return {
        "id": model.model_id,
        "object": "model",
        "created": int(model.created_at.timestamp()),
        "owned_by": "speedinfer",
        "pricing": {
            "input": format_credits(model.input_price),
            "output": format_credits(model.output_price),
            "cached_input": format_credits(model.cached_input_price_or_input),
        },
        "max_output_tokens": model.max_output_tokens,
        "kind": model.kind,
    }


async def models_list(ex: Exchange) -> None:
    key = await authenticate(ex, "models")
    models = await catalog.public_models()
    data = [
        model_object(m)
        for model_id, m in sorted(models.items())
        if not key.allowed_models or model_id in key.allowed_models
    ]
    await ex.respond_json(200, {"object": "list", "data": data})


async def model_retrieve(ex: Exchange) -> None:
    key = await authenticate(ex, "models")
    # ASGI's path is already percent-decoded: "acme%2Fmodel-1" arrives as "acme/model-1".
    model_id = ex.scope["path"].rstrip("/")[len(MODEL_PREFIX) :]
    model = (await catalog.public_models()).get(model_id)
    # A model outside the key's allow-list is as unknown to it as one that does not exist.
    if model is None or (key.allowed_models and model_id not in key.allowed_models):
        raise GatewayError(404, "model_not_found", f"the model '{model_id}' does not exist", param="model")
    await ex.respond_json(200, model_object(model))


async def key_show(ex: Exchange) -> None:
    key = await authenticate(ex, "usage")
    await ex.respond_json(200, await _key_summary(key=key))


async def usage_list(ex: Exchange) -> None:
    key = await authenticate(ex, "usage")
    query = ex.query()
    try:
        limit = int(query.get("limit", "20"))
        after = int(query["after"]) if query.get("after") else None
    except ValueError:
        raise GatewayError(400, "invalid_request", "'limit' and 'after' must be integers") from None
    if not 1 <= limit <= 100:
        raise GatewayError(400, "invalid_request", "'limit' must be between 1 and 100", param="limit")
    await ex.respond_json(200, await _usage_page(key=key, limit=limit, after=after))


ROUTES: dict[str, tuple[bytes, Handler]] = {
    "/v1/chat/completions": (b"POST", chat_completions),
    "/v1/completions": (b"POST", completions),
    "/v1/embeddings": (b"POST", embeddings),
    "/v1/responses": (b"POST", responses),
    "/v1/rerank": (b"POST", rerank),
    "/v1/models": (b"GET", models_list),
    "/v1/key": (b"GET", key_show),
    "/v1/usage": (b"GET", usage_list),
}


# Past this many /v1 requests in flight, the process answers new ones at once with 503 overloaded:
# memory and the event loop's lag grow with every open request, and a process that took them all would
# answer none of them well (docs/operations.md, Capacity). Read once at start-up; 0 turns it off.
_max_inflight = state.Lazy("proxy.asgi.max_inflight", lambda: int(settings.SPEEDINFER_MAX_INFLIGHT))
_inflight = 0  # /v1 requests this process is serving now (every increment has its decrement)
_OVERLOADED = GatewayError(
    503,
    "overloaded",
    "this gateway process is at capacity; nothing was charged; retry shortly",
    headers=[(b"retry-after", b"1")],
)


def inflight() -> int:
    return _inflight


async def gateway_app(scope: Scope, receive: Receive, send: Send) -> None:
    global _inflight
    start_journal_replay()  # once per process: servers without the ASGI lifespan (daphne) start here
    limit = _max_inflight.get()
    if limit and _inflight >= limit:
        await _refuse_overloaded(scope, receive, send)
        return
    _inflight += 1
    try:
        await _gateway_app(scope, receive, send)
    finally:
        _inflight -= 1


async def _refuse_overloaded(scope: Scope, receive: Receive, send: Send) -> None:
    ex = Exchange(scope, receive, send)
    await ex.respond_error(_OVERLOADED)
    path = scope["path"].rstrip("/")
    ex.outcome.endpoint = path if path in ROUTES else "/v1/models/{id}" if path.startswith(MODEL_PREFIX) else "other"
    observe_request(ex.outcome)
    log_request(ex.outcome)


async def _gateway_app(scope: Scope, receive: Receive, send: Send) -> None:
    ex = Exchange(scope, receive, send)
    path = scope["path"].rstrip("/") or "/"
    route = ROUTES.get(path)
    if route is None and path.startswith(MODEL_PREFIX):
        route = (b"GET", model_retrieve)
        path = "/v1/models/{id}"  # the metrics' and log's endpoint label: one series for every model
    ex.trace = request_trace(scope, path if route is not None else "other", ex.request_id)
    try:
        if route is None:
            raise GatewayError(404, "not_found", f"unknown URL: {scope['method']} {scope['path']}")
        method, handler = route
        if scope["method"].encode() != method:
            raise GatewayError(405, "method_not_allowed", f"{path} accepts {method.decode()} only")
        await handler(ex)
    except GatewayError as error:
        if not ex.response_started:
            await ex.respond_error(error)
    except _UNREACHABLE as exc:
        log.warning("request %s: %s unreachable: %s", ex.request_id, _dependency(exc), exc)
        if not ex.response_started:
            what = _UNAVAILABLE[_dependency(exc)]
            await ex.respond_error(
                GatewayError(
                    503, "service_unavailable", f"the {what} cannot be reached; nothing was charged; retry shortly"
                )
            )
    except Exception:
        log.exception("request %s failed", ex.request_id)
        if not ex.response_started:
            await ex.respond_error(GatewayError(500, "internal_error", "internal error; the request was not charged"))
    finally:
        ex.outcome.endpoint = path if route is not None else "other"
        observe_request(ex.outcome)
        log_request(ex.outcome)
        ex.trace.end(ex.outcome)
        if ex.outcome.status >= 400:
            _count_refusal(ex)


_refusal_lookups: set[asyncio.Task[None]] = set()


def _count_refusal(ex: Exchange) -> None:
    """A refused request is counted for its key's account (core.refusals). A body refused before its
    key was looked at (the gateway parses first) has its key looked up after the answer went out."""
    outcome = ex.outcome
    if outcome.account_id is None and outcome.status == 400 and outcome.error_code == "invalid_request":
        raw = ex.bearer()
        if raw:
            task = asyncio.get_running_loop().create_task(_count_after_lookup(raw, outcome))
            _refusal_lookups.add(task)
            task.add_done_callback(_refusal_lookups.discard)
    elif is_refusal(outcome):
        note_refusal(outcome)


async def _count_after_lookup(raw_key: str, outcome: RequestOutcome) -> None:
    try:
        key = (await api_key_authenticate_async(raw_key=raw_key)).key
    except Exception as exc:  # an outage loses the count, nothing else
        log.warning("request %s: refusal not counted: %s", outcome.request_id, exc)
        return
    if key is not None:
        outcome.account_id, outcome.key_prefix = key.account_id, key.prefix
        if is_refusal(outcome):
            note_refusal(outcome)


_UNREACHABLE: tuple[type[Exception], ...] = (DatabaseUnavailable, RedisUnavailable, *DB_ERRORS)
_UNAVAILABLE = {"database": "service's database", "redis": "rate-limit store"}


def _dependency(exc: Exception) -> str:
    return "redis" if isinstance(exc, RedisUnavailable) else "database"


# Paths a client of an OpenAI-compatible server (or of vLLM's own root routes) may try: they answer the
# gateway's JSON 404 (an OpenAI error body), never the site's HTML page.
_API_LOOKING = re.compile(
    r"^/(v\d+(/|$)|(tokenize|detokenize|rerank|score|classify|pooling|embeddings|completions|responses|models|"
    r"moderations|chat|audio|images|files|batches|invocations)(/|$))"
)


# The public price list is a page at /models/ (console.pages.prices): a browser asking for HTML gets it,
# an API client that left /v1 out of its base URL still gets the JSON 404.
_PAGES = frozenset({"/models", "/models/"})


def _wants_page(scope: Scope) -> bool:
    if scope["path"] not in _PAGES:
        return False
    accept = next((value for name, value in scope.get("headers", ()) if name == b"accept"), b"")
    return b"text/html" in accept


def with_gateway(django_app: Any) -> ASGIApp:
    """HTTP requests under /v1 (and API-looking paths, answered with a JSON 404) go to the gateway,
    everything else to Django."""
    configure_tracing()  # once per process, at start-up: on only with OTEL_EXPORTER_OTLP_ENDPOINT set

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        if path.startswith("/v1/") or path == "/v1" or (_API_LOOKING.match(path) and not _wants_page(scope)):
            await gateway_app(scope, receive, send)
        else:
            await django_app(scope, receive, send)

    return app
