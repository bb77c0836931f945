"""Errors a worker call can end in, each with the gateway's status and error code (CONTRACT)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx


class WorkerError(Exception):
    """A worker call failed; nothing is charged. `counts_against_circuit` marks worker faults
    (connection errors, timeouts, 5xx) as opposed to answers that were merely unusable."""

    status = 502
    code = "upstream_error"
    counts_against_circuit = True

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        # Upstream's own words, for the logs only: may name endpoints, so never sent to clients.
        self.detail = detail


class UpstreamError(WorkerError):
    status = 502
    code = "upstream_error"


class UpstreamTimeout(WorkerError):
    status = 504
    code = "upstream_timeout"


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


@contextmanager
def http_failures(
    who: str = "the worker", *, timed_out: str = "did not answer in time", broken: str = "could not be reached"
) -> Iterator[None]:
    """The one translation of transport failures into CONTRACT's errors: a timeout (httpx's, or an
    asyncio deadline) is 504 upstream_timeout, any other httpx error 502 upstream_error. A WorkerError
    raised inside passes through as it is."""
    try:
        yield
    except (httpx.TimeoutException, TimeoutError) as exc:
        raise UpstreamTimeout(f"{who} {timed_out}", detail=repr(exc)) from None
    except httpx.HTTPError as exc:
        raise UpstreamError(f"{who} {broken}", detail=repr(exc)) from None
