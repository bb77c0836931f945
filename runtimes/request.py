"""What a worker is asked (a parsed completion request) and what it reports back (usage)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

CHAT = "chat"
COMPLETIONS = "completions"
EMBEDDINGS = "embeddings"

# A count outside 0..MAX_TOKEN_COUNT is not authoritative usage (a worker's bug, or an overflow such
# as 2^31): the request ends in runtime_usage_unavailable and nothing is charged. The ledger
# (billing.services) refuses the same range.
MAX_TOKEN_COUNT = 1_000_000_000


@dataclass(slots=True)
class CompletionParams:
    endpoint: str  # CHAT, COMPLETIONS or EMBEDDINGS (texts: the inputs; body.encoding_format)
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None  # what the client asked for, before the model's cap
    texts: list[str]  # every piece of prompt text, for the prompt-token bound
    messages: list[dict[str, Any]]  # chat only
    prompt: str  # completions only
    cache_key: str = ""  # the OpenAI `prompt_cache_key`: an explicit prefix-affinity key (workers.prefix)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


def usage_from(data: Any) -> Usage | None:
    """Authoritative usage from an OpenAI `usage` object, or None when absent or malformed."""
    if not isinstance(data, dict):
        return None
    prompt, completion = data.get("prompt_tokens"), data.get("completion_tokens")
    if not is_token_count(prompt) or not is_token_count(completion):
        return None
    return Usage(prompt, completion)


def is_token_count(value: Any) -> TypeGuard[int]:
    """An int (not a bool or float) in 0..MAX_TOKEN_COUNT."""
    return type(value) is int and 0 <= value <= MAX_TOKEN_COUNT
