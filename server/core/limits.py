"""Request body limits: size and time. Starlette has no size limit built in (fastapi #362), so this
ASGI middleware checks Content-Length up front and also counts the bytes actually streamed (chunked
bodies lie by omission); and the whole body must arrive within `body_timeout` seconds of the
headers, so a client that declares a length and stalls is answered 408 instead of holding its
connection and a worker slot forever (the header timeout is in server/core/http_guards.py). When
the server has the whole body in memory before the app reads it (the protocol there marks the
scope with BODY_RECEIVED, as it does for most requests), no deadline is armed: an asyncio timeout
costs as much as the rest of a small request's body handling."""

from __future__ import annotations

import asyncio

from fastapi import HTTPException
from harmony_mobile.server.core.errors import error_response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

BODY_RECEIVED = "harmony.body_received"


def too_large_message(limit: int, size: int | None = None) -> str:
    if size is None:  # a chunked body that went past the limit before it ended
        return f"request body is over the limit of {limit} bytes (max_body_bytes)"
    return f"request body is {size} bytes; the limit is {limit} bytes (max_body_bytes)"


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout: float):
        self.app, self.limit, self.body_timeout = app, max_body_bytes, body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value
                break
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
        await self.app(scope, self._guarded_receive(scope, receive), send)

    def _guarded_receive(self, scope: Scope, receive: Receive) -> Receive:
        received = 0
        deadline = asyncio.get_running_loop().time() + self.body_timeout
        complete = False

        async def guarded_receive() -> Message:
            nonlocal received, complete
            if complete:  # after the body only a disconnect can come: no deadline on waiting for it
                return await receive()
            try:
                if scope.get(BODY_RECEIVED):  # receive() returns at once
                    message = await receive()
                else:
                    async with asyncio.timeout_at(deadline):
                        message = await receive()
            except TimeoutError:
                # FastAPI re-raises HTTPException from body reading unchanged: this becomes the 408.
                raise HTTPException(
                    408, f"request body not complete within {self.body_timeout:g} s", {"Connection": "close"}
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > self.limit:
                    raise HTTPException(413, too_large_message(self.limit))
            return message

        return guarded_receive
