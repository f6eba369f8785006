"""Error bodies and the exception handlers that produce them (docs/PROTOCOL.md section 8).

Every error is JSON with one readable sentence: `{"error": ...}` on the KServe V2 routes (`/v2...`,
the key the Open Inference Protocol and its clients read) and `{"detail": ...}` everywhere else.
No exception escapes to uvicorn: an unexpected one is answered with a JSON 500 and logged once.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.routing import Match

from harmony_mobile.protocol.validation import validation_problems

log = logging.getLogger("harmony_mobile.server")

V2_PREFIX = "/v2"


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


class FailureRun:
    """Logs the failures of a background loop once per run of them, not once per attempt: every
    process of every replica retries every few seconds, so a database outage would fill the logs.
    The first failure (or one of another class) is one warning: a single line for a store
    OperationalError (the database is down or unreachable; its traceback says nothing), with the
    traceback for anything else (a bug). The first success after a run is one info line."""

    def __init__(self, logger: logging.Logger, task: str):
        self.logger, self.task = logger, task
        self.failing: type[Exception] | None = None  # the class of the current run's errors

    def failed(self, error: Exception) -> None:
        if type(error) is self.failing:
            self.logger.debug("%s still fails: %s", self.task, first_line(error))
        elif isinstance(error, OperationalError):
            cause = error.orig or error
            self.logger.warning(
                "store unreachable: %s fails until it answers (%s: %s)",
                self.task,
                type(cause).__name__,
                first_line(cause),
            )
        else:
            self.logger.warning("%s failed", self.task, exc_info=error)
        self.failing = type(error)

    def succeeded(self) -> None:
        if self.failing is None:
            return
        store = "store reachable again: " if issubclass(self.failing, OperationalError) else ""
        self.logger.info("%s%s works again", store, self.task)
        self.failing = None


def error_key(path: str) -> str:
    return "error" if path == V2_PREFIX or path.startswith(V2_PREFIX + "/") else "detail"


def error_response(path: str, status_code: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({error_key(path): message}, status_code=status_code, headers=headers)


def validation_message(errors: list[dict]) -> str:
    return f"invalid request: {validation_problems(errors, whole='body')}"


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(app: FastAPI, scope: dict) -> list[str]:
    """Every method some route serves at this request's path: each route is asked whether it would
    take the request with that method (included routers nest, so there is no flat route list)."""
    found = []
    for method in HTTP_METHODS:
        probe = {**scope, "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in app.router.routes):
            found.append(method)
    return found


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        headers = dict(error.headers or {})
        message = error.detail if isinstance(error.detail, str) else str(error.detail)
        if error.status_code == 405:
            allow = allowed_methods(request.app, request.scope)
            headers["Allow"] = ", ".join(allow)
            message = f"method {request.method} is not allowed here; allowed: {', '.join(allow)}"
        elif error.status_code == 404 and message == "Not Found":
            message = f"no route {request.url.path!r}; see docs/PROTOCOL.md"
        return error_response(request.url.path, error.status_code, message, headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        # One readable sentence, like every other error (the apps show it as a string).
        message = validation_message(error.errors())
        content_type = request.headers.get("content-type", "")
        if any(e["loc"] == ("body",) for e in error.errors()) and "json" not in content_type:
            message += (
                f" (the body is read as JSON: send Content-Type: application/json, not {content_type!r})"
            )
        return error_response(request.url.path, 422, message)

    @app.exception_handler(OperationalError)
    async def store_unavailable(request: Request, error: OperationalError) -> JSONResponse:
        # The database is down, unreachable or locked past its timeout: a retry can succeed.
        log.warning("store unavailable on %s %s: %s", request.method, request.url.path, error.orig)
        retry = str(request.app.state.harmony.settings.retry_after_seconds)
        return error_response(
            request.url.path, 503, "the store is unavailable; retry later", headers={"Retry-After": retry}
        )

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, error: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(request.url.path, 500, f"internal error ({type(error).__name__})")
