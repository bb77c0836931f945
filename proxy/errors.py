"""The gateway's refusals, each with its status and code from docs/interface.md, Errors."""

from __future__ import annotations

from core.errors import error_body


class GatewayError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers or []

    def body(self) -> dict[str, object]:
        return error_body(status=self.status, code=self.code, message=self.message, param=self.param)
