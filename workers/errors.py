"""Errors a worker call can end in, each with the gateway's status and error code (CONTRACT)."""

from __future__ import annotations


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
