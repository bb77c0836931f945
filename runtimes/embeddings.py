"""Embeddings on a worker: the Triton embedding model's registration and OpenAI's answer shape.

The calls themselves are the transports' `embed`: `runtimes.openai.openai_embed` forwards to an
OpenAI-compatible worker, `runtimes.triton.triton_embed` infers on a Triton embedding model.

A Triton worker serves embeddings when its runtime_config has an `embeddings` object naming the model and
its tensors (README, Workers):

    "embeddings": {"model_name": "text_embedding", "input_name": "text_input",
                   "output_name": "embedding", "prompt_tokens_output_name": "prompt_tokens"}

The inputs go as one BYTES batch of shape [n, 1]; the FP32 output is read as n vectors (its shape says the
dimension), and the count output's values are summed into usage.prompt_tokens. `encoding_format: base64`
is answered the way OpenAI does: each vector's little-endian float32 bytes, base64-encoded.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from runtimes.target import WorkerTarget

EMBEDDING_NAMES = ("model_name", "input_name", "output_name", "prompt_tokens_output_name")


def embeddings_config(worker: WorkerTarget) -> dict[str, Any] | None:
    """A Triton worker's `runtime_config.embeddings`, when it declares an embedding model."""
    config = worker.runtime_config.get("embeddings")
    return config if isinstance(config, dict) else None


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


def embeddings_answer(
    *, model: str, vectors: list[list[float]], prompt_tokens: int, encoding_format: str
) -> dict[str, Any]:
    """OpenAI's embeddings answer."""
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode_vector(v, encoding_format)}
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
