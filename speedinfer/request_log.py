"""One JSON line per /v1 request on the `speedinfer.requests` logger.

The gateway calls `log_request` once per finished request (next to
speedinfer.metrics.observe_request). Fields are fixed: nothing from headers or
bodies, so no secret (API key, worker credential, prompt) can end up in a log.
"""

from __future__ import annotations

import json
import logging
import time

logger = logging.getLogger("speedinfer.requests")


def request_log_line(
    *,
    request_id: str,
    account_id: int | None,
    key_prefix: str = "",
    endpoint: str,
    model: str,
    worker_id: str,
    status: int,
    error_code: str = "",
    latency_ms: int,
    ttft_ms: int | None = None,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    streamed: bool = False,
) -> str:
    return json.dumps(
        {
            "ts": round(time.time(), 3),
            "event": "request",
            "request_id": request_id,
            "account": account_id,
            "key": key_prefix,  # the public prefix (sk-si-xxxxxxxxxxxx), never the secret
            "endpoint": endpoint,
            "model": model,
            "worker": worker_id,
            "status": status,
            "error": error_code or None,
            "latency_ms": latency_ms,
            "ttft_ms": ttft_ms,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "streamed": streamed,
        },
        separators=(",", ":"),
    )


def log_request(
    *,
    request_id: str,
    account_id: int | None,
    key_prefix: str = "",
    endpoint: str,
    model: str,
    worker_id: str,
    status: int,
    error_code: str = "",
    latency_ms: int,
    ttft_ms: int | None = None,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    streamed: bool = False,
) -> None:
    if not logger.isEnabledFor(logging.INFO):
        return
    logger.info(
        request_log_line(
            request_id=request_id,
            account_id=account_id,
            key_prefix=key_prefix,
            endpoint=endpoint,
            model=model,
            worker_id=worker_id,
            status=status,
            error_code=error_code,
            latency_ms=latency_ms,
            ttft_ms=ttft_ms,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            streamed=streamed,
        )
    )
