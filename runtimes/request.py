"""What a worker is asked (a parsed completion request) and what it reports back (usage)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHAT = "chat"
COMPLETIONS = "completions"
EMBEDDINGS = "embeddings"


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


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


def usage_from(data: Any) -> Usage | None:
    """Authoritative usage from an OpenAI `usage` object, or None when absent or malformed."""
    if not isinstance(data, dict):
        return None
    prompt, completion = data.get("prompt_tokens"), data.get("completion_tokens")
    if type(prompt) is not int or type(completion) is not int or prompt < 0 or completion < 0:
        return None
    return Usage(prompt, completion)
