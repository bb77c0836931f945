"""The billed call: one request's reservation from hold to close (docs/interface.md, Money invariants).

reserve the bound -> keep its lease while the request runs -> settle from the worker's usage, or release
(nothing charged); with the database unreachable the close is queued (proxy.pending) and the answer
still goes out.

The reservation is leased while the request runs (renewed every billing.services.LEASE_RENEW_EVERY),
so the sweeper never frees a running request's hold; a settle that finds it expired anyway still charges.

Charging on client disconnect mid-stream (see README, "The API"):
- the worker's usage event had already arrived: settle with it (the client was sent all the content);
- no content had been sent yet: release, nothing is charged;
- otherwise: charge what was delivered: one completion token per content chunk sent to the client
  (OpenAI-compatible runtimes stream one token per chunk) plus the prompt, estimated at one token per
  4 bytes of prompt text (capped by the reserved bound), since the worker had processed all of it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

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
from proxy.pending import pending_close
from proxy.services import request_reserve
from runtimes.interface import WorkerClient
from runtimes.request import EMBEDDINGS, CompletionParams, Usage
from runtimes.target import WorkerTarget

log = logging.getLogger("speedinfer.gateway")

_ENDPOINT_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", EMBEDDINGS: "/v1/embeddings"}


@dataclass
class BilledCall:
    """Everything one completion request carries through the path."""

    ex: Exchange
    params: CompletionParams
    key: KeyInfo
    model: PublicModel
    max_tokens: int
    prompt_bound: int
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
        the reservation is the input's bound at the input price) and the prompt's token bound."""
        cap = model.max_output_tokens
        max_tokens = min(params.max_tokens, cap) if params.max_tokens else cap
        if params.endpoint == EMBEDDINGS:
            max_tokens = 0
        prompt_bound = prompt_token_bound(texts=params.texts, messages=len(params.messages))
        return cls(ex=ex, params=params, key=key, model=model, max_tokens=max_tokens, prompt_bound=prompt_bound)

    @property
    def token_bound(self) -> int:
        return self.prompt_bound + self.max_tokens

    def _outcome(self) -> RequestOutcome:
        outcome = self.ex.outcome
        outcome.worker_id = self.worker.worker_id if self.worker else ""
        outcome.endpoint = _ENDPOINT_PATHS[self.params.endpoint]
        return outcome

    async def reserve(self) -> None:
        """Hold the bound's cost, or 402 insufficient_credits / key_budget_exceeded."""
        amount = cost_of(
            prompt_tokens=self.prompt_bound,
            completion_tokens=self.max_tokens,
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
            completion = min(self.max_tokens, self.delivered_chunks)
            await self.settle(Usage(prompt, completion), status)
        log.info(
            "request %s: client disconnected mid-stream after %d chunks", self.ex.request_id, self.delivered_chunks
        )


async def _close_or_queue(what: str, reservation_id: object, close: Callable[[], Awaitable[object]]) -> None:
    """Settle or release now; with the database unreachable, queue it (proxy.pending) and go on: the
    worker's answer still reaches the client, and the close is written as soon as the database is back."""
    try:
        await close()
    except DatabaseUnavailable:
        pending_close(what=what, reservation_id=reservation_id, close=close)
