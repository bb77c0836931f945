"""OpenAI-shaped error bodies: {"error": {"message", "type", "code", "param"}}."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import AuthenticationFailed
from rest_framework.response import Response
from rest_framework.views import exception_handler

# status -> OpenAI error "type"
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    429: "rate_limit_error",
    502: "api_error",
    503: "api_error",
    504: "api_error",
}


def error_body(*, status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "api_error"), "code": code, "param": param}}


def drf_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = exception_handler(exc, context)
    if response is None:
        return None
    status = response.status_code
    code = {401: "not_authenticated", 403: "permission_denied", 404: "not_found", 405: "method_not_allowed"}.get(
        status, "invalid_request"
    )
    if isinstance(exc, AuthenticationFailed):
        code = "invalid_api_key"
    data = response.data
    param = None
    if isinstance(data, dict) and "detail" in data:
        message = str(data["detail"])
    elif isinstance(data, dict) and data:
        param = next(iter(data))
        first = data[param]
        detail = str(first[0] if isinstance(first, list) and first else first)
        # Validators that reuse a command's parser (core.credits) already name the field.
        message = detail if detail.startswith(f"{param}: ") else f"{param}: {detail}"
    else:
        message = str(data)
    response.data = error_body(status=status, code=code, message=message, param=param)
    return response
