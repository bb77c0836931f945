"""What a worker is asked (a parsed completion request) and what it reports back (usage)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeGuard

CHAT = "chat"
COMPLETIONS = "completions"
EMBEDDINGS = "embeddings"
RESPONSES = "responses"  # body: the Responses request (runtimes.responses translates it for chat workers)
RERANK = "rerank"  # texts: the query, then the documents
ENDPOINT_PATHS = {
    CHAT: "/v1/chat/completions",
    COMPLETIONS: "/v1/completions",
    EMBEDDINGS: "/v1/embeddings",
    RESPONSES: "/v1/responses",
    RERANK: "/v1/rerank",
}

# A count outside 0..MAX_TOKEN_COUNT is not authoritative usage (a worker's bug, or an overflow such
# as 2^31): the request ends in runtime_usage_unavailable and nothing is charged. The ledger
# (billing.services) refuses the same range.
MAX_TOKEN_COUNT = 1_000_000_000


@dataclass(slots=True)
class CompletionParams:
    endpoint: str  # CHAT, COMPLETIONS, EMBEDDINGS (texts: the inputs; body.encoding_format), RESPONSES or RERANK
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None  # what the client asked for, before the model's cap
    texts: list[str]  # every piece of prompt text, for the prompt-token bound
    messages: list[dict[str, Any]]  # chat only
    prompt: str  # completions only
    # The W3C traceparent the worker is sent (the gateway's worker-call span), "" for none. A transport
    # puts it in its request's headers, so a worker that traces joins the request's trace.
    traceparent: str = ""
    # The prompt bound's inputs (billing.pricing.prompt_token_bound): the body's size as received,
    # and what is counted apart from its bytes (token-id prompts by their count, media parts by the
    # model's allowance) with the compact JSON size of those values, taken off the body's size.
    body_bytes: int = -1  # -1: not known (a body built by the gateway), measured from `body` when billed
    apart_bytes: int = 0
    apart_tokens: int = 0
    media_parts: int = 0
    choices: int = 1  # completions generated: max(n, best_of), times the prompts of a batch
    # Capabilities flags the worker must have (tools, response_format, n, logprobs, media), each with
    # the request field that asks for it: the gateway routes and refuses by them.
    needs: dict[str, str] = field(default_factory=dict)
    cache_key: str = ""  # the OpenAI `prompt_cache_key`: an explicit prefix-affinity key (workers.prefix)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # of the prompt tokens, served from the runtime's prefix cache
    reasoning_tokens: int = 0  # of the completion tokens, spent reasoning


def _detail(data: dict[str, Any], details: str, name: str, most: int) -> int:
    """A count in usage.<details>.<name>; 0 when absent or not believable (above `most`, its total)."""
    section = data.get(details)
    value = section.get(name) if isinstance(section, dict) else None
    return value if is_token_count(value) and value <= most else 0


def usage_from(data: Any) -> Usage | None:
    """Authoritative usage from an OpenAI `usage` object, or None when absent or malformed."""
    if not isinstance(data, dict):
        return None
    prompt, completion = data.get("prompt_tokens"), data.get("completion_tokens")
    if not is_token_count(prompt) or not is_token_count(completion):
        return None
    return Usage(
        prompt,
        completion,
        cached_tokens=_detail(data, "prompt_tokens_details", "cached_tokens", prompt),
        reasoning_tokens=_detail(data, "completion_tokens_details", "reasoning_tokens", completion),
    )


def is_token_count(value: Any) -> TypeGuard[int]:
    """An int (not a bool or float) in 0..MAX_TOKEN_COUNT."""
    return type(value) is int and 0 <= value <= MAX_TOKEN_COUNT
