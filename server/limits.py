"""Request body size limit. Starlette has none built in (fastapi #362), so this ASGI middleware checks
Content-Length up front and also counts the bytes actually streamed (chunked bodies lie by omission)."""

from __future__ import annotations

from fastapi import HTTPException
from harmony_mobile.server.errors import error_response
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def too_large_message(limit: int, size: int | None = None) -> str:
    got = f"{size} bytes" if size is not None else "more"
    return f"request body is {got}; the limit is {limit} bytes (max_body_bytes)"


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app, self.limit = app, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                size = -1
            if size < 0:
                response = error_response(scope["path"], 400, "Content-Length is not a non-negative integer")
                await response(scope, receive, send)
                return
            if size > self.limit:
                response = error_response(scope["path"], 413, too_large_message(self.limit, size))
                await response(scope, receive, send)
                return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    # FastAPI re-raises HTTPException from body reading unchanged, so this becomes a 413.
                    raise HTTPException(413, too_large_message(self.limit))
            return message

        await self.app(scope, counting_receive, send)
