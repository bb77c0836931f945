"""One /v1 request and its response, on raw ASGI (no Django request or middleware on the hot path)."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from core.outcome import RequestOutcome
from proxy.errors import GatewayError
from proxy.tracing import NO_TRACE, NoTrace

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY_BYTES = 8 * 1024 * 1024
_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:\-]{1,100}$")
_NOT_REQUEST_ID = re.compile(rb"[^A-Za-z0-9._:\-]+")
_JSON = (b"content-type", b"application/json")
_SSE = (b"content-type", b"text/event-stream; charset=utf-8")


def _request_id(given: bytes) -> str:
    """The client's X-Request-ID, kept as it is when it is up to 100 of A-Za-z0-9._:- and otherwise in a
    sanitised form (each run of other bytes one `_`, cut to 100), so the client can still find its
    request in the logs; a fresh id when nothing is left (docs/api.md, Endpoints and scopes)."""
    if _REQUEST_ID.match(given):
        return given.decode()
    cleaned = _NOT_REQUEST_ID.sub(b"_", given).strip(b"_")[:100]
    return cleaned.decode() if cleaned else uuid.uuid4().hex


class Exchange:
    __slots__ = (
        "scope",
        "receive",
        "_send",
        "request_id",
        "authorization",
        "response_started",
        "extra_headers",
        "disconnected",
        "interruptible",
        "task",
        "outcome",
        "recording",
        "trace",
    )

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self.receive = receive
        self._send = send
        self.response_started = False
        self.extra_headers: list[tuple[bytes, bytes]] = []
        self.disconnected = False
        self.interruptible = False  # True while cancelling the task on disconnect is safe (no DB write running)
        self.task: asyncio.Task[Any] | None = None
        self.recording: list[bytes] | None = None  # the answer's body as sent, when an Idempotency-Key keeps it
        self.trace: NoTrace = NO_TRACE  # proxy.tracing: the request's spans, when tracing is on
        request_id = b""
        authorization = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"x-request-id":
                request_id = value
        self.authorization = authorization
        self.request_id = _request_id(request_id)
        # How the request ends: filled in along the path, then handed to the ledger, metrics and log.
        self.outcome = RequestOutcome(request_id=self.request_id)

    def bearer(self) -> str:
        scheme, _, token = self.authorization.partition(b" ")
        return token.strip().decode("latin-1") if scheme.lower() == b"bearer" else ""

    def query(self) -> dict[str, str]:
        from urllib.parse import parse_qsl

        return dict(parse_qsl(self.scope.get("query_string", b"").decode("latin-1")))

    async def body(self) -> bytes:
        chunks = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                raise GatewayError(400, "invalid_request", "the client went away before sending the body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                limit = MAX_BODY_BYTES / (1024 * 1024)
                raise GatewayError(413, "request_too_large", f"the request body exceeds the limit of {limit:g} MiB")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _headers(
        self, content_type: tuple[bytes, bytes], extra: list[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        return [content_type, (b"x-request-id", self.request_id.encode()), *self.extra_headers, *extra]

    async def respond_json(self, status: int, payload: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        body = orjson.dumps(payload)
        all_headers = self._headers(_JSON, headers or [])
        all_headers.append((b"content-length", str(len(body)).encode()))
        self.outcome.status = status
        self.response_started = True
        await self._send({"type": "http.response.start", "status": status, "headers": all_headers})
        await self._send({"type": "http.response.body", "body": body})
        if self.recording is not None:
            self.recording.append(body)

    async def respond_error(self, error: GatewayError) -> None:
        self.outcome.error_code = error.code
        await self.respond_json(error.status, error.body(), error.headers)

    async def start_stream(self) -> None:
        self.outcome.status = 200
        self.response_started = True
        headers = self._headers(_SSE, [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")])
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def send_chunk(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})
        if self.recording is not None:
            self.recording.append(data)

    async def end_stream(self, data: bytes = b"") -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": False})
        if self.recording is not None:
            self.recording.append(data)

    def watch_disconnect(self) -> asyncio.Task[None]:
        """Notice the client leaving while we stream (uvicorn's send() then silently drops data).

        Call only after the body has been read: the watcher owns receive().
        """
        self.task = asyncio.current_task()

        async def watch() -> None:
            while True:
                message = await self.receive()
                if message["type"] == "http.disconnect":
                    self.disconnected = True
                    if self.interruptible and self.task is not None:
                        self.task.cancel()
                    return

        return asyncio.create_task(watch())
