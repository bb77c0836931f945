"""POST /v1/embeddings on a worker: forwarded to an OpenAI-compatible one, or inferred on a Triton embedding model.

A Triton worker serves embeddings when its runtime_config has an `embeddings` object naming the model and
its tensors (README, Workers):

    "embeddings": {"model_name": "text_embedding", "input_name": "text_input",
                   "output_name": "embedding", "prompt_tokens_output_name": "prompt_tokens"}

The inputs go as one BYTES batch of shape [n, 1]; the FP32 output is read as n vectors (its shape says the
dimension), and the count output's values are summed into usage.prompt_tokens. `encoding_format: base64`
is answered the way OpenAI does: each vector's little-endian float32 bytes, base64-encoded.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from typing import Any

import orjson

from runtimes.errors import RuntimeUsageUnavailable, TritonInferenceFailed, WorkerRejected, http_failures
from runtimes.http import get_client, worker_timeout, worker_total_timeout
from runtimes.openai import auth_headers, send_for_json
from runtimes.request import CompletionParams, Usage
from runtimes.target import WorkerTarget
from runtimes.triton import triton_rejection

EMBEDDING_NAMES = ("model_name", "input_name", "output_name", "prompt_tokens_output_name")


def embeddings_config(worker: WorkerTarget) -> dict[str, Any] | None:
    """A Triton worker's `runtime_config.embeddings`, when it declares an embedding model."""
    config = worker.runtime_config.get("embeddings")
    return config if isinstance(config, dict) else None


def generates_text(worker: WorkerTarget) -> bool:
    """False for a Triton worker registered for embeddings only (no text-generation tensor names)."""
    return worker.transport != "triton" or bool(worker.runtime_config.get("model_name"))


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


async def openai_embed(
    *, worker: WorkerTarget, params: CompletionParams, max_tokens: int, request_id: str
) -> tuple[dict[str, Any], Usage]:
    """POST {endpoint}/embeddings, the body as the client sent it but for the worker's model id."""
    body = dict(params.body)
    body["model"] = worker.upstream_model(params.model)
    headers = {"content-type": "application/json", "x-request-id": request_id, **auth_headers(worker)}
    request = get_client().build_request(
        "POST",
        worker.endpoint + "/embeddings",
        content=orjson.dumps(body),
        headers=headers,
        timeout=worker_timeout(worker.runtime_config),
    )
    data = await send_for_json(worker, request)
    usage = data.get("usage")
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if type(prompt_tokens) is not int or prompt_tokens < 0:
        raise RuntimeUsageUnavailable("the worker's answer has no usage; nothing was charged")
    data["model"] = params.model
    return data, Usage(prompt_tokens, 0)


def _flat(data: Any) -> list[Any]:
    if isinstance(data, list):
        return [item for inner in data for item in _flat(inner)]
    return [data]


async def triton_embed(
    *, worker: WorkerTarget, params: CompletionParams, max_tokens: int, request_id: str
) -> tuple[dict[str, Any], Usage]:
    """POST /v2/models/{embeddings.model_name}/infer; the vectors and the model's own prompt-token count."""
    config = embeddings_config(worker)
    if config is None:
        raise WorkerRejected(f"the model '{params.model}' does not serve embeddings")
    texts = params.texts
    count_name = config["prompt_tokens_output_name"]
    body = {
        "inputs": [
            {
                "name": config["input_name"],
                "shape": [len(texts), 1],
                "datatype": "BYTES",
                "data": [[text] for text in texts],
            }
        ],
        "outputs": [
            {"name": name, "parameters": {"binary_data": False}} for name in (config["output_name"], count_name)
        ],
    }
    url = f"{worker.endpoint}/v2/models/{config['model_name']}/infer"
    timeouts = worker.runtime_config
    with http_failures("the Triton worker"):
        async with asyncio.timeout(worker_total_timeout(timeouts)):
            response = await get_client().post(url, json=body, timeout=worker_timeout(timeouts))
    if response.status_code != 200:
        message = _error_text(response.text)
        if response.status_code == 400 and f"unexpected inference output '{count_name}'" in message:
            raise RuntimeUsageUnavailable("the Triton worker returned no authoritative token counts", detail=message)
        raise triton_rejection(worker, response.status_code, message)
    try:
        answer = response.json()
    except (ValueError, json.JSONDecodeError):
        raise TritonInferenceFailed("the Triton worker's answer is not JSON", detail=response.text[:500]) from None
    outputs = {
        str(o.get("name")): o for o in (answer.get("outputs") or []) if isinstance(answer, dict) and isinstance(o, dict)
    }
    vectors = _vectors(outputs.get(config["output_name"]), len(texts))
    prompt_tokens = _total(outputs.get(count_name), count_name)
    encoding_format = str(params.body.get("encoding_format") or "float")
    data = embeddings_answer(
        model=params.model, vectors=vectors, prompt_tokens=prompt_tokens, encoding_format=encoding_format
    )
    return data, Usage(prompt_tokens, 0)


def _error_text(text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500]
    return str(body["error"]) if isinstance(body, dict) and "error" in body else text[:500]


def _vectors(output: Any, count: int) -> list[list[float]]:
    if not isinstance(output, dict):
        raise TritonInferenceFailed("the Triton worker's answer has no embedding output")
    values = _flat(output.get("data"))
    if not values or count == 0 or len(values) % count or not all(isinstance(v, int | float) for v in values):
        raise TritonInferenceFailed(
            "the Triton worker's embedding output is not one vector per input",
            detail=f"{len(values)} values for {count} inputs, shape {output.get('shape')!r}",
        )
    size = len(values) // count
    return [[float(v) for v in values[i * size : (i + 1) * size]] for i in range(count)]


def _total(output: Any, name: str) -> int:
    values = _flat(output.get("data")) if isinstance(output, dict) else []
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
        raise RuntimeUsageUnavailable(
            "the Triton worker returned no authoritative token counts",
            detail=f"output {name!r} missing or not counts",
        )
    return sum(values)
