"""The OpenAPI document, made exact: what FastAPI generates, plus what it cannot know.

* Statuses every route can answer because of the middleware and dependencies in front of it:
  400 (a Content-Length that is not a number), 405 (with `Allow`), 408 (header or body timeout),
  413 (body limit), and on
  authenticated routes 401 / 403 / 429 (token bucket) / 503 (the store is unreachable).
* The request body schemas of the routes that read their body themselves: `InferRequest` (infer)
  and the /v1 bodies read after authentication (server/routes/bodies.py).
* int64 bounds as integers (pydantic writes 2**63 - 1 as a float, which is 2**63).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from harmony_mobile.server.core.errors import error_key
from harmony_mobile.server.core.schemas import (
    INT64_MAX,
    AlignmentParams,
    EnrolRequest,
    ErrorBody,
    InferRequest,
    SetDefaultRequest,
    UploadRequest,
    V2ErrorBody,
)

ALWAYS = {
    400: "malformed request framing (e.g. a Content-Length that is not a number)",
    405: "method not allowed on this path; the Allow header lists the allowed ones",
    408: "headers or body not complete within the configured time",
    413: "body larger than max_body_bytes",
}
AUTHENTICATED = {
    401: "missing, unknown or revoked bearer token",
    403: "valid token of the wrong role",
    429: "per-device rate limit; see Retry-After",
    503: "store unavailable or not ready; see Retry-After",
}
WITH_INPUT = {422: "well-formed but invalid parameters or body"}
WITH_PATH_PARAMS = {404: "unknown model, version, device or round"}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}


def _error_response(path: str, description: str, status: int) -> dict[str, Any]:
    schema = "V2ErrorBody" if error_key(path) == "error" else "ErrorBody"
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }
    if status in (429, 503):
        response["headers"] = RETRY_AFTER
    if status == 405:
        response["headers"] = {"Allow": {"description": "allowed methods", "schema": {"type": "string"}}}
    return response


def _complete_operation(path: str, operation: dict[str, Any]) -> None:
    statuses = dict(ALWAYS)
    if operation.get("security"):
        statuses |= AUTHENTICATED
    parameters = operation.get("parameters", [])
    if parameters or "requestBody" in operation:
        statuses |= WITH_INPUT
    if any(p.get("in") == "path" for p in parameters):
        statuses |= WITH_PATH_PARAMS
    responses = operation.setdefault("responses", {})
    for status, description in statuses.items():
        responses.setdefault(str(status), _error_response(path, description, status))


def _integral_bounds(node: Any) -> None:
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for key in ("maximum", "minimum", "exclusiveMaximum", "exclusiveMinimum"):
                value = node.get(key)
                if isinstance(value, float):
                    node[key] = INT64_MAX if value >= float(INT64_MAX) else int(value)
        for child in node.values():
            _integral_bounds(child)
    elif isinstance(node, list):
        for child in node:
            _integral_bounds(child)


def _add_schema(components: dict[str, Any], model: type) -> None:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in schema.pop("$defs", {}).items():
        components.setdefault(name, definition)
    components.setdefault(model.__name__, schema)


def exact_openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    components = document.setdefault("components", {}).setdefault("schemas", {})
    for model in (
        InferRequest,
        ErrorBody,
        V2ErrorBody,
        UploadRequest,
        EnrolRequest,
        AlignmentParams,
        SetDefaultRequest,
    ):
        _add_schema(components, model)
    for path, item in document["paths"].items():
        for operation in item.values():
            _complete_operation(path, operation)
    _integral_bounds(document)
    app.openapi_schema = document
    return document


def install_openapi(app: FastAPI) -> None:
    app.openapi = lambda: exact_openapi(app)  # type: ignore[method-assign]
