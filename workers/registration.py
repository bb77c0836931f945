"""The one validation of the spec's worker registration JSON.

`manage.py registerworker`, the staff API and the admin all call
`registration_validate`, so a document is accepted or refused the same way
everywhere, with a ValidationError naming the offending field
(`runtime_config.model_name`, `gpu_metadata.serial`, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError

from catalog.models import PublicModel
from runtimes.embeddings import EMBEDDING_NAMES

RUNTIMES = ("triton", "tensorrt-llm", "cuda")
TRANSPORTS = ("triton", "openai")
TRITON_NAMES = (
    "model_name",
    "input_name",
    "max_tokens_input_name",
    "output_name",
    "prompt_tokens_output_name",
    "completion_tokens_output_name",
)
TIMEOUT_KEYS = ("connect_timeout", "read_timeout", "total_timeout")
REGISTRATION_KEYS = (
    "worker_id",
    "worker_type",
    "runtime",
    "runtime_endpoint",
    "supported_models",
    "runtime_config",
    "runtime_metadata",
    "gpu_metadata",
    "upstream_api_key",
    "enabled",
)
# Read-only keys the API adds on the way out; accepted and ignored on the way in
# so a document fetched from the API can be sent back unchanged.
OUTPUT_ONLY_KEYS = ("transport", "status", "has_upstream_api_key")

_WORKER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}$")
# Words in a metadata key that mean a device identity or a credential (spec 003:
# never publish GPU serials or worker credentials).
_SECRET_WORDS = {
    "serial",
    "uuid",
    "guid",
    "token",
    "password",
    "passwd",
    "secret",
    "credential",
    "credentials",
    "apikey",
    "api_key",
    "auth",
    "authorization",
    "bearer",
    "private_key",
}
_UUID_VALUE = re.compile(r"(?i)\b(gpu-|mig-)?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


@dataclass(frozen=True)
class WorkerSpec:
    """A validated registration, ready to be stored."""

    worker_id: str
    worker_type: str
    runtime: str
    transport: str
    runtime_endpoint: str
    supported_models: list[str]
    runtime_config: dict[str, Any] = field(default_factory=dict)
    runtime_metadata: dict[str, Any] = field(default_factory=dict)
    gpu_metadata: dict[str, Any] = field(default_factory=dict)
    # None: not given (keep what is stored); "": clear it.
    upstream_api_key: str | None = None
    enabled: bool | None = None


def _error(name: str, message: str) -> ValidationError:
    return ValidationError({name: message})


def _key_words(key: str) -> set[str]:
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()
    words = {w for w in re.split(r"[^a-z0-9]+", snake) if w}
    compact = re.sub(r"[^a-z0-9]", "", snake)
    return words | {w for w in ("api_key", "private_key") if w.replace("_", "") in compact}


def _check_no_secrets(value: Any, *, path: str) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            inner_path = f"{path}.{key}"
            if not isinstance(key, str):
                raise _error(path, "keys must be strings")
            if _key_words(key) & _SECRET_WORDS:
                raise _error(
                    inner_path,
                    "looks like a serial number, UUID or credential; these must not be registered as metadata "
                    "(a worker's own key goes in upstream_api_key)",
                )
            _check_no_secrets(inner, path=inner_path)
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            _check_no_secrets(inner, path=f"{path}[{i}]")
    elif isinstance(value, str) and _UUID_VALUE.search(value):
        raise _error(path, "looks like a GPU UUID or serial; these must not be registered")


def _object(data: dict[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _error(name, "must be a JSON object")
    return value


def _nonempty_str(value: Any, name: str, *, max_length: int = 200) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _error(name, "is required and must be a non-empty string")
    if len(value) > max_length:
        raise _error(name, f"must be at most {max_length} characters")
    return value.strip()


def _endpoint(value: Any, name: str = "runtime_endpoint") -> str:
    url = _nonempty_str(value, name, max_length=500)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _error(name, f"must be an http:// or https:// URL with a host, got {url!r}")
    if parts.username or parts.password:
        hint = "; use upstream_api_key" if name == "runtime_endpoint" else ""
        raise _error(name, f"must not carry credentials{hint}")
    if parts.query or parts.fragment:
        raise _error(name, "must not have a query or fragment")
    return url.rstrip("/")


def _transport(runtime: str, config: dict[str, Any]) -> str:
    given = config.get("transport")
    if given is not None and given not in TRANSPORTS:
        raise _error(
            "runtime_config.transport", f"unknown transport {given!r}; expected one of {', '.join(TRANSPORTS)}"
        )
    if runtime == "triton":
        if given not in (None, "triton"):
            raise _error("runtime_config.transport", "a triton runtime always uses the triton transport")
        return "triton"
    if runtime == "cuda":
        if given not in (None, "openai"):
            raise _error("runtime_config.transport", "a cuda runtime always uses the openai transport")
        return "openai"
    if given is None:
        raise _error("runtime_config.transport", "is required for tensorrt-llm: 'triton' or 'openai'")
    return str(given)


def _check_config(config: dict[str, Any], *, transport: str, models: list[str]) -> None:
    embeddings = config.get("embeddings")
    if transport == "triton":
        # A worker for a Triton embedding model alone needs no text-generation names.
        if embeddings is None or any(config.get(name) is not None for name in TRITON_NAMES):
            for name in TRITON_NAMES:
                _nonempty_str(config.get(name), f"runtime_config.{name}")
        if config.get("cached_tokens_output_name") is not None:
            # Optional: the output holding how many prompt tokens the runtime served from its cache.
            _nonempty_str(config["cached_tokens_output_name"], "runtime_config.cached_tokens_output_name")
        _check_chat_template(config.get("chat_template"))
        if embeddings is not None:
            _check_embeddings(embeddings)
        _check_streaming(config)
    elif embeddings is not None:
        raise _error("runtime_config.embeddings", "is for the triton transport; OpenAI-compatible workers need none")
    elif "streaming" in config or "generate_inputs" in config:
        key = "streaming" if "streaming" in config else "generate_inputs"
        raise _error(
            f"runtime_config.{key}", "is for the triton transport only; OpenAI-compatible workers always stream"
        )
    responses = config.get("responses")
    if responses is not None:
        # The worker serves POST /responses itself (vLLM); otherwise the gateway translates to chat.
        if not isinstance(responses, bool):
            raise _error("runtime_config.responses", "must be true or false")
        if responses and transport != "openai":
            raise _error("runtime_config.responses", "is for the openai transport (Triton requests are translated)")
    model_map = config.get("model_map")
    if model_map is not None:
        if not isinstance(model_map, dict):
            raise _error("runtime_config.model_map", "must be an object {public_model_id: upstream_model_id}")
        for public, upstream in model_map.items():
            if public not in models:
                raise _error(f"runtime_config.model_map.{public}", "is not one of supported_models")
            _nonempty_str(upstream, f"runtime_config.model_map.{public}")
    if config.get("metrics_url") is not None:
        # The runtime's Prometheus endpoint, read by the probes for its queue (workers/load.py).
        config["metrics_url"] = _endpoint(config["metrics_url"], "runtime_config.metrics_url")
    for name in TIMEOUT_KEYS:
        value = config.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
            raise _error(f"runtime_config.{name}", "must be a positive number of seconds")
    concurrency = config.get("max_concurrency")
    # How many requests it runs at once before its own queue grows (workers.queue gates on it).
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise _error("runtime_config.max_concurrency", "must be a positive integer (requests it runs at once)")


def _check_embeddings(value: Any) -> None:
    name = "runtime_config.embeddings"
    if not isinstance(value, dict):
        raise _error(name, "must be an object {" + ", ".join(EMBEDDING_NAMES) + "}")
    for key in value:
        if key not in EMBEDDING_NAMES:
            raise _error(f"{name}.{key}", f"unknown key; expected one of {', '.join(EMBEDDING_NAMES)}")
    for key in EMBEDDING_NAMES:
        _nonempty_str(value.get(key), f"{name}.{key}")


def _check_streaming(config: dict[str, Any]) -> None:
    """`streaming` opts a Triton worker in to generate_stream; `generate_inputs` are extra flat inputs
    sent with it (TensorRT-LLM's ensemble returns counts only when asked: return_num_input_tokens)."""
    streaming = config.get("streaming")
    if streaming is not None and streaming != "generate_stream":
        raise _error("runtime_config.streaming", "must be 'generate_stream' (Triton's generate extension), or absent")
    if streaming is not None and config.get("model_name") is None:
        raise _error("runtime_config.model_name", "is required for streaming (the decoupled text model)")
    extra = config.get("generate_inputs")
    if extra is None:
        return
    name = "runtime_config.generate_inputs"
    if streaming is None:
        raise _error(name, "needs runtime_config.streaming = 'generate_stream'")
    if not isinstance(extra, dict):
        raise _error(name, "must be an object {input_name: value}")
    reserved = {config.get("input_name"), config.get("max_tokens_input_name"), "stream"}
    for key, value in extra.items():
        if key in reserved:
            raise _error(f"{name}.{key}", "is set by SpeedInfer from the request")
        if isinstance(value, dict | list) or value is None:
            raise _error(f"{name}.{key}", "must be a string, a number or a boolean")


def _check_chat_template(template: Any) -> None:
    if template is None:
        return
    name = "runtime_config.chat_template"
    if not isinstance(template, dict):
        raise _error(name, 'must be an object {"prefix", "message", "suffix"}; "message" uses {role} and {content}')
    for key, value in template.items():
        if key not in ("prefix", "message", "suffix"):
            raise _error(f"{name}.{key}", "unknown key; expected prefix, message or suffix")
        if not isinstance(value, str):
            raise _error(f"{name}.{key}", "must be a string")
    if "{content}" not in template.get("message", "{content}"):
        raise _error(f"{name}.message", "must contain {content}")


def _supported_models(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise _error("supported_models", "must be a non-empty list of public model ids")
    models: list[str] = []
    for item in value:
        model_id = _nonempty_str(item, "supported_models")
        if model_id not in models:
            models.append(model_id)
    known = set(PublicModel.objects.filter(model_id__in=models).values_list("model_id", flat=True))
    missing = [m for m in models if m not in known]
    if missing:
        raise _error(
            "supported_models",
            f"{missing[0]!r} is not a registered public model (register it with `manage.py registermodel`)",
        )
    return models


def registration_validate(data: Any) -> WorkerSpec:
    """Check one registration document; raises ValidationError naming the field."""
    if not isinstance(data, dict):
        raise _error("__all__", "a worker registration must be a JSON object")
    for key in data:
        if key not in REGISTRATION_KEYS and key not in OUTPUT_ONLY_KEYS:
            raise _error(str(key), "unknown field")
    worker_id = _nonempty_str(data.get("worker_id"), "worker_id")
    if not _WORKER_ID.match(worker_id):
        raise _error("worker_id", "may hold letters, digits and . _ : @ - only")
    worker_type = data.get("worker_type", "nvidia-gpu")
    worker_type = _nonempty_str(worker_type, "worker_type", max_length=50)
    runtime = data.get("runtime")
    if runtime not in RUNTIMES:
        raise _error("runtime", f"unknown runtime {runtime!r}; expected one of {', '.join(RUNTIMES)}")
    endpoint = _endpoint(data.get("runtime_endpoint"))
    config = _object(data, "runtime_config")
    runtime_metadata = _object(data, "runtime_metadata")
    gpu_metadata = _object(data, "gpu_metadata")
    transport = _transport(str(runtime), config)
    models = _supported_models(data.get("supported_models"))
    _check_config(config, transport=transport, models=models)
    _check_no_secrets(config, path="runtime_config")
    _check_no_secrets(runtime_metadata, path="runtime_metadata")
    _check_no_secrets(gpu_metadata, path="gpu_metadata")
    api_key = data.get("upstream_api_key")
    if api_key is not None and (not isinstance(api_key, str) or len(api_key) > 500):
        raise _error("upstream_api_key", "must be a string of at most 500 characters")
    enabled = data.get("enabled")
    if enabled is not None and not isinstance(enabled, bool):
        raise _error("enabled", "must be true or false")
    return WorkerSpec(
        worker_id=worker_id,
        worker_type=worker_type,
        runtime=str(runtime),
        transport=transport,
        runtime_endpoint=endpoint,
        supported_models=models,
        runtime_config=config,
        runtime_metadata=runtime_metadata,
        gpu_metadata=gpu_metadata,
        upstream_api_key=api_key,
        enabled=enabled,
    )
