"""Errors a worker call can end in, each with the gateway's status and error code (docs/interface.md, Errors)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx
import orjson


class WorkerError(Exception):
    """A worker call failed; nothing is charged. `counts_against_circuit` marks worker faults
    (connection errors, timeouts, 5xx) as opposed to answers that were merely unusable."""

    status = 502
    code = "upstream_error"
    counts_against_circuit = True
    # False where the client's retry of the same request would fail the same way (the gateway then
    # answers `x-should-retry: false`, which the openai SDK honours; docs/api.md, Errors).
    retry_helps = True
    retry_after: int | None = None  # seconds, sent as Retry-After

    def __init__(self, message: str, *, detail: str = "", unreachable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        # The connection itself was refused or failed: the gateway stops choosing the worker at once.
        self.unreachable = unreachable
        # Upstream's own words, for the logs only: may name endpoints, so never sent to clients.
        self.detail = detail


class UpstreamError(WorkerError):
    status = 502
    code = "upstream_error"


class UpstreamTimeout(WorkerError):
    status = 504
    code = "upstream_timeout"


class UpstreamPoolBusy(WorkerError):
    """Every connection of this process's upstream pool was in use for the whole pool wait: the gateway
    process is at capacity, the worker is not at fault (no circuit count, no retry on another worker:
    the pool is the process's). docs/interface.md, Errors: 503 overloaded with Retry-After."""

    status = 503
    code = "overloaded"
    counts_against_circuit = False
    retry_after = 1


class TritonInferenceFailed(WorkerError):
    status = 502
    code = "triton_inference_failed"

    def __init__(self, message: str, *, detail: str = "", server_fault: bool = True) -> None:
        super().__init__(message, detail=detail)
        # A 4xx from Triton is a rejected request, not a sick worker.
        self.counts_against_circuit = server_fault


class RuntimeUsageUnavailable(WorkerError):
    status = 502
    code = "runtime_usage_unavailable"
    counts_against_circuit = False
    retry_helps = False  # the worker answers the same shape again


@contextmanager
def http_failures(
    who: str = "the worker", *, timed_out: str = "did not answer in time", broken: str = "could not be reached"
) -> Iterator[None]:
    """The one translation of transport failures into the errors of docs/interface.md: a timeout (httpx's, or an
    asyncio deadline) is 504 upstream_timeout, any other httpx error 502 upstream_error; a wait for one
    of this process's pooled connections that ran out is 503 overloaded (UpstreamPoolBusy), not a worker
    fault. A WorkerError raised inside passes through as it is."""
    try:
        yield
    except httpx.PoolTimeout as exc:
        raise UpstreamPoolBusy("the gateway is at capacity; retry shortly", detail=repr(exc)) from None
    except (httpx.TimeoutException, TimeoutError) as exc:
        error = UpstreamTimeout(f"{who} {timed_out}", detail=repr(exc))
        # Not connecting in time may pass; an answer that outlasts the read or total timeout is as long
        # the next time.
        error.retry_helps = isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout)
        raise error from None
    except httpx.ConnectError as exc:
        raise UpstreamError(f"{who} {broken}", detail=repr(exc), unreachable=True) from None
    except httpx.HTTPError as exc:
        raise UpstreamError(f"{who} {broken}", detail=repr(exc)) from None


class WorkerRejected(WorkerError):
    """The worker refused the request as the client's mistake (a prompt longer than its context, a bad
    parameter): its own words go to the client, scrubbed of its address; nothing is charged, and the
    worker is not sick."""

    status = 400
    code = "invalid_request"
    counts_against_circuit = False


# A worker's 401/403 is our misconfiguration (its credential), 404 a wrong model name or path,
# 429 its own overload: none is the client's to fix, so they stay 502 upstream_error.
_NOT_THE_CLIENTS = frozenset({401, 403, 404, 429})
MAX_WORKER_MESSAGE = 500


def worker_message(text: str, *, endpoint: str) -> str:
    """The worker's message as a client may see it: without the worker's endpoint or host, one line, truncated."""
    message = " ".join(text.split())
    if endpoint:
        host = urlsplit(endpoint).netloc
        hostname = urlsplit(endpoint).hostname or ""
        for secret in sorted({endpoint, endpoint.split("://", 1)[-1], host, hostname} - {""}, key=len, reverse=True):
            message = message.replace(secret, "<worker>")
    if len(message) > MAX_WORKER_MESSAGE:
        message = message[: MAX_WORKER_MESSAGE - 3] + "..."
    return message


def is_client_error(status: int) -> bool:
    """A worker's 4xx that the client can fix by changing its request."""
    return 400 <= status < 500 and status not in _NOT_THE_CLIENTS


def openai_error_message(body: bytes | str) -> str:
    """The `message` of an OpenAI-shaped error body (`{"error": {"message"}}`, `{"error": "..."}`,
    `{"message"}`, or FastAPI's `{"detail"}`); "" when there is none."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(data, dict):
        return ""
    error = data.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    for value in (error, data.get("message"), data.get("detail")):
        if isinstance(value, str):
            return value
    return ""
