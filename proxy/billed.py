"""The billed call: one request's reservation from hold to close (docs/interface.md, Money invariants).

reserve the bound -> keep its lease while the request runs -> settle from the worker's usage, or release
(nothing charged); with the database unreachable the close is queued (proxy.pending) and the answer
still goes out.

The reservation is leased while the request runs (renewed every billing.services.LEASE_RENEW_EVERY),
so the sweeper never frees a running request's hold; a settle that finds it expired anyway still charges.

The disconnect rule (docs/billing.md, "Clients that disconnect"), in this module only, for every
transport and endpoint that streams (proxy.streaming, the Responses API):
- mid-stream (`BilledCall.charge_disconnected`, counting with `delivered_tokens`):
  - the worker's usage event had already arrived: settle with it (the client was sent everything);
  - nothing had been sent yet: release, nothing is charged;
  - otherwise: charge what was delivered: one completion token per delta sent to the client that
    carries generated text (content, reasoning_content / reasoning, tool or function call arguments;
    OpenAI-compatible runtimes stream one token per delta) plus the prompt, estimated at one token per
    4 bytes of prompt text (capped by the reserved bound), since the worker had processed all of it;
- before a non-streaming answer was sent (`BilledCall.charge_abandoned`): release, nothing is
  charged; the caller has already closed the upstream request, so the worker stops.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from accounts.key_cache import KeyInfo
from billing.models import UsageRecord
from billing.pricing import cost_of, prompt_token_bound
from billing.services import (
    InsufficientCredits,
    KeyBudgetExceeded,
    reservation_release_async,
    reservation_settle_async,
)
from catalog.models import PublicModel
from core.metrics import observe_spend, observe_uncharged_overrun
from core.outages import DatabaseUnavailable
from core.outcome import RequestOutcome
from proxy.errors import GatewayError
from proxy.exchange import Exchange
from proxy.pending import claim_replay, pending_close, replay_orphans
from proxy.services import request_reserve
from runtimes.interface import WorkerClient
from runtimes.request import EMBEDDINGS, ENDPOINT_PATHS, RERANK, CompletionParams, Usage
from runtimes.target import WorkerTarget

log = logging.getLogger("speedinfer.gateway")


@dataclass
class BilledCall:
    """Everything one completion request carries through the path."""

    ex: Exchange
    params: CompletionParams
    key: KeyInfo
    model: PublicModel
    max_tokens: int
    prompt_bound: int
    completion_bound: int  # max_tokens (per choice) times the choices
    clients: list[WorkerClient] = field(default_factory=list)  # the selected workers, in preference order
    reservation_id: Any = None
    worker: WorkerTarget | None = None
    usage: Usage | None = None
    delivered_chunks: int = 0
    closed: bool = False  # the reservation was settled or released
    settled: bool = False  # ... and the request was charged

    @classmethod
    def for_request(cls, *, ex: Exchange, params: CompletionParams, key: KeyInfo, model: PublicModel) -> BilledCall:
        """The call with its bounds: the model's output cap (0 for embeddings, which produce no tokens:
        the reservation is the input's bound at the input price; rerank likewise) and the prompt's token bound."""
        cap = model.max_output_tokens
        max_tokens = min(params.max_tokens, cap) if params.max_tokens else cap
        if params.endpoint in (EMBEDDINGS, RERANK):
            max_tokens = 0
        completion_bound = max_tokens * params.choices  # every choice (n, best_of) is generated and billed
        if params.media_parts and not model.media_tokens:
            part = params.needs.get("media", "messages")
            raise GatewayError(
                400,
                "invalid_request",
                f"'{part}' is a media part, and the model '{model.model_id}' takes no media parts",
                param=part,
            )
        body_bytes = params.body_bytes if params.body_bytes >= 0 else len(orjson.dumps(params.body))
        prompt_bound = prompt_token_bound(
            body_bytes=body_bytes,
            messages=len(params.messages),
            apart_bytes=params.apart_bytes,
            apart_tokens=params.apart_tokens,
            media_parts=params.media_parts,
            media_tokens=model.media_tokens,
        )
        return cls(
            ex=ex,
            params=params,
            key=key,
            model=model,
            max_tokens=max_tokens,
            prompt_bound=prompt_bound,
            completion_bound=completion_bound,
        )

    @property
    def token_bound(self) -> int:
        return self.prompt_bound + self.completion_bound

    def _outcome(self) -> RequestOutcome:
        outcome = self.ex.outcome
        outcome.worker_id = self.worker.worker_id if self.worker else ""
        outcome.endpoint = ENDPOINT_PATHS[self.params.endpoint]
        return outcome

    async def reserve(self) -> None:
        """Hold the bound's cost, or 402 insufficient_credits / key_budget_exceeded."""
        amount = cost_of(
            prompt_tokens=self.prompt_bound,
            completion_tokens=self.completion_bound,
            input_price=self.model.input_price,
            output_price=self.model.output_price,
        )
        try:
            reservation = await request_reserve(
                key=self.key,
                model=self.model,
                amount=max(1, amount),  # a free model still holds a token micro-credit, so it settles like any other
                request_id=self.ex.request_id,
            )
        except InsufficientCredits as exc:
            raise GatewayError(402, "insufficient_credits", f"insufficient credits: {exc}") from None
        except KeyBudgetExceeded as exc:
            raise GatewayError(402, "key_budget_exceeded", str(exc)) from None
        self.reservation_id = reservation.pk

    async def settle(self, usage: Usage, status: str = UsageRecord.Status.OK) -> None:
        outcome = self._outcome()

        async def close() -> object:
            record = await reservation_settle_async(
                reservation_id=self.reservation_id,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                cached_tokens=usage.cached_tokens,
                reasoning_tokens=usage.reasoning_tokens,
                outcome=outcome,
                status=status,
                account_id=self.key.account_id,
            )
            if record is not None:
                observe_spend(record.model_id, record.cost)
                if record.uncharged:
                    observe_uncharged_overrun(worker_id=record.worker_id, micro_credits=record.uncharged)
            return record

        entry = {
            "what": "settle",
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "status": str(status),
            "outcome": _outcome_entry(outcome),
        }
        with self.ex.trace.step("settle"):
            await _close_or_queue("settle", self.reservation_id, close, entry)
        # Closed once the settle committed (or was queued until the database is back): a settle that
        # raised otherwise leaves the hold to release(), so nothing stays held.
        self.closed = self.settled = True

    async def release(self, error_code: str) -> None:
        if self.closed or self.reservation_id is None:
            return
        self.closed = True
        outcome = self._outcome()

        def close() -> Awaitable[object]:
            return reservation_release_async(
                reservation_id=self.reservation_id,
                error_code=error_code,
                outcome=outcome,
                account_id=self.key.account_id,
            )

        entry = {"what": "release", "error_code": error_code, "outcome": _outcome_entry(outcome)}
        with self.ex.trace.step("release"):
            await _close_or_queue("release", self.reservation_id, close, entry)

    def retry_fingerprint(self) -> str:
        """The client request as its retries share it: the key and its Idempotency-Key, else the key and
        the body (the openai SDK resends the same body). Computed only when a worker call fails."""
        material = b""
        for name, value in self.ex.scope["headers"]:
            if name == b"idempotency-key":
                material = b"i:" + value
        if not material:
            material = b"b:" + orjson.dumps(self.params.body, option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(self.key.digest.encode() + b"\0" + material).hexdigest()[:32]

    def note_sent(self, choices: Any) -> None:
        """A chunk with these `choices` reached the client: count it for the disconnect rule."""
        if isinstance(choices, list):
            self.delivered_chunks += sum(delivered_tokens(choice) for choice in choices)

    async def charge_abandoned(self) -> None:
        """The client left before the non-streaming answer was sent: nothing is charged, and the usage
        record says client_disconnected (the openai SDK's timeout-and-retry then pays once)."""
        self.ex.outcome.status = 499
        await self.release("client_disconnected")
        log.info("request %s: client disconnected before the answer", self.ex.request_id)

    async def charge_disconnected(self) -> None:
        """The client left mid-stream: charge what it was sent, nothing more (policy in the module docstring)."""
        status = UsageRecord.Status.CLIENT_DISCONNECTED
        self.ex.outcome.status = 499
        if self.usage is not None:
            await self.settle(self.usage, status)
        elif self.delivered_chunks == 0:
            await self.release("client_disconnected")
        else:
            prompt_bytes = sum(len(t.encode()) for t in self.params.texts)
            prompt = min(self.prompt_bound, math.ceil(prompt_bytes / 4))
            completion = min(self.completion_bound, self.delivered_chunks)
            await self.settle(Usage(prompt, completion), status)
        log.info(
            "request %s: client disconnected mid-stream after %d chunks", self.ex.request_id, self.delivered_chunks
        )


def delivered_tokens(choice: Any) -> int:
    """The disconnect rule's count for one streamed choice sent to the client: 1 when it carries
    generated text (a `delta` with content, reasoning_content or reasoning, tool_calls or
    function_call; a completions choice's `text`), else 0 (a role-only delta, a finish_reason).

    The one rule for every stream: proxy.streaming relays every transport's stream (OpenAI-compatible
    and Triton's) through it, and the Responses API's stream counts its chat deltas with it too.
    """
    if not isinstance(choice, dict):
        return 0
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return int(
            bool(
                delta.get("content")
                or delta.get("reasoning_content")
                or delta.get("reasoning")
                or delta.get("tool_calls")
                or delta.get("function_call")
            )
        )
    return int(bool(choice.get("text")))


async def _close_or_queue(
    what: str, reservation_id: object, close: Callable[[], Awaitable[object]], entry: dict[str, Any]
) -> None:
    """Settle or release now; with the database unreachable, queue it (proxy.pending, journalled on
    disk) and go on: the worker's answer still reaches the client, and the close is written as soon as
    the database is back, by this process or, if it dies first, by the next one to start."""
    try:
        await close()
    except DatabaseUnavailable:
        pending_close(what=what, reservation_id=reservation_id, close=close, entry=entry)


def _outcome_entry(outcome: RequestOutcome) -> dict[str, Any]:
    """The usage record's columns that come from the outcome, frozen for the journal."""
    return {
        "request_id": outcome.request_id,
        "endpoint": outcome.endpoint,
        "worker_id": outcome.worker_id,
        "streamed": outcome.streamed,
        "latency": outcome.duration(),
        "ttft": outcome.ttft,
    }


def _journalled_close(entry: dict[str, Any]) -> Callable[[], Awaitable[object]]:
    """The same settle or release as the one journalled by a process that died (proxy.pending)."""
    fields = entry.get("outcome") or {}
    outcome = RequestOutcome(
        request_id=str(fields.get("request_id", "")),
        endpoint=str(fields.get("endpoint", "")),
        worker_id=str(fields.get("worker_id", "")),
        streamed=bool(fields.get("streamed", False)),
        latency=float(fields.get("latency") or 0.0),
        ttft=fields.get("ttft"),
    )
    reservation_id = entry["reservation_id"]
    if entry.get("what") == "settle":

        async def settle() -> object:
            record = await reservation_settle_async(
                reservation_id=reservation_id,
                prompt_tokens=int(entry["prompt_tokens"]),
                completion_tokens=int(entry["completion_tokens"]),
                outcome=outcome,
                status=str(entry.get("status") or UsageRecord.Status.OK),
            )
            if record is not None:
                observe_spend(record.model_id, record.cost)
            return record

        return settle

    def release() -> Awaitable[object]:
        return reservation_release_async(
            reservation_id=reservation_id, error_code=str(entry.get("error_code", "")), outcome=outcome
        )

    return release


async def replay_journal() -> int:
    """At start-up: write the closes journalled by gateway processes that died (proxy.pending)."""
    try:
        return await replay_orphans(make_close=_journalled_close)
    except Exception:
        log.exception("replaying the close journal failed")
        return 0


def start_journal_replay() -> None:
    """Once per process, on its event loop: lifespan start-up, else the first /v1 request."""
    if claim_replay():
        task = asyncio.get_running_loop().create_task(replay_journal())
        _replays.add(task)
        task.add_done_callback(_replays.discard)


_replays: set[asyncio.Task[int]] = set()
