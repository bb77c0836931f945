"""Server-sent events from a worker, one `data` payload at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from runtimes.errors import http_failures


async def sse_data(response: httpx.Response) -> AsyncIterator[bytes]:
    """The `data` payload of each server-sent event, as it arrives (no buffering beyond one event)."""
    buffer = b""
    with http_failures(timed_out="stopped answering mid-stream", broken="broke off its stream"):
        async for chunk in response.aiter_raw():
            buffer += chunk
            if b"\r" in buffer:
                buffer = buffer.replace(b"\r\n", b"\n")
            while True:
                end = buffer.find(b"\n\n")
                if end < 0:
                    break
                event, buffer = buffer[:end], buffer[end + 2 :]
                data = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
                if data:
                    yield data[0] if len(data) == 1 else b"\n".join(data)
