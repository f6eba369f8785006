"""Infer requests go straight to their handler, ahead of FastAPI's router.

A phone's fallback request is the one route whose per-request Python cost decides throughput, and
FastAPI's router costs more than the handler: it tries every route in turn, rebuilds the route's
handler for each request of an included router and resolves dependencies the handler does not
use. This ASGI middleware sits innermost (inside the metrics and body-limit middleware) and hands
`POST /v2/models/{name}[/versions/{version}]/infer` to the same handler the router would call.
The routes stay declared on the router, which documents them in the OpenAPI schema and answers
every other method on those paths.

Errors are answered by the app's own exception handlers, as Starlette's exception middleware
would: an HTTPException or a store outage becomes its JSON error body; anything else propagates to
the outermost handler (a logged JSON 500).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

InferHandler = Callable[[Request, str, str | None], Awaitable[Response]]
ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]

DEFAULT_PATH = "/v2/models/{name}/infer"
VERSION_PATH = "/v2/models/{name}/versions/{version}/infer"
INFER_PATHS = (DEFAULT_PATH, VERSION_PATH)


def match_infer_path(path: str) -> tuple[str, str, str | None] | None:
    """(route path, model name, version or None) of an infer URL path, else None. A segment must be
    non-empty, as in the router's `{name}` pattern."""
    parts = path.split("/")
    if len(parts) == 5 and parts[:3] == ["", "v2", "models"] and parts[4] == "infer" and parts[3]:
        return DEFAULT_PATH, parts[3], None
    if (
        len(parts) == 7
        and parts[:3] == ["", "v2", "models"]
        and parts[4] == "versions"
        and parts[6] == "infer"
        and parts[3]
        and parts[5]
    ):
        return VERSION_PATH, parts[3], parts[5]
    return None


def find_handler(handlers: Mapping, error: Exception) -> ExceptionHandler | None:
    """The app's handler for this error's class or nearest base, as Starlette looks it up; the
    catch-all `Exception` handler is left to the outermost middleware, as Starlette leaves it."""
    for cls in type(error).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None


class InferDispatch:
    def __init__(
        self,
        app: ASGIApp,
        handle: InferHandler,
        routes: Mapping[str, BaseRoute],
        exception_handlers: Mapping,
    ):
        self.app, self.handle = app, handle
        self.routes, self.exception_handlers = routes, exception_handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = (
            match_infer_path(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        )
        if match is None:
            await self.app(scope, receive, send)
            return
        route_path, name, version = match
        scope["route"] = self.routes[route_path]  # the metrics label, as the router would set it
        request = Request(scope, receive)
        try:
            response = await self.handle(request, name, version)
        except Exception as error:
            handler = find_handler(self.exception_handlers, error)
            if handler is None:
                raise
            response = await handler(request, error)
        await response(scope, receive, send)
