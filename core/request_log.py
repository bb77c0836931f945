"""One JSON line per /v1 request on the `speedinfer.requests` logger.

The gateway calls `log_request` once per finished request with the request's
core.outcome.RequestOutcome (the same record the metrics and the ledger get).
Fields are fixed: nothing from headers or bodies, so no secret (API key, worker
credential, prompt) can end up in a log.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import orjson

from core.outcome import RequestOutcome

logger = logging.getLogger("speedinfer.requests")


def request_log_line(outcome: RequestOutcome) -> str:
    # orjson: a third of json.dumps's cost, and the same compact output.
    return orjson.dumps(
        {
            # ISO 8601 UTC to the millisecond, like the other log lines' readable times.
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "event": "request",
            "request_id": outcome.request_id,
            "account": outcome.account_id,
            "key": outcome.key_prefix,  # the public prefix (sk-si-xxxxxxxxxxxx), never the secret
            "endpoint": outcome.endpoint,
            "model": outcome.model,
            "worker": outcome.worker_id,
            "status": outcome.status,
            "error": outcome.error_code or None,
            "latency_ms": outcome.latency_ms(),
            "ttft_ms": outcome.ttft_ms(),
            "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "streamed": outcome.streamed,
        }
    ).decode()


def log_request(outcome: RequestOutcome) -> None:
    if logger.isEnabledFor(logging.INFO):
        logger.info(request_log_line(outcome))
