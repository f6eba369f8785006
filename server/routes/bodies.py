"""JSON request bodies of the /v1 routes, read only after the bearer token was checked.

FastAPI decodes a body declared in the signature before it runs any dependency, so a body that is
not JSON would be 422 before a missing token is 401. These routes take their body through a
dependency that depends on the route's auth dependency instead (docs/PROTOCOL.md 4.5 step 1). The
body may carry `Content-Encoding: gzip` or `deflate`, as on /v2; any other encoding is 415. Errors
keep FastAPI's form (422, `body.<field>: ...`), and the OpenAPI document names the body by hand
(`openapi_body`).
"""

from __future__ import annotations

import email.message
import json
from typing import Any, TypeVar

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from harmony_mobile.server.core.v2_codec import InferBodyError, decompress
from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)


def _is_json(content_type: str | None) -> bool:
    """FastAPI's rule: no Content-Type, application/json or application/*+json (any parameters)."""
    if not content_type:
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _decode_error(position: int | None) -> RequestValidationError:
    loc = ("body",) if position is None else ("body", position)
    return RequestValidationError(
        [{"type": "json_invalid", "loc": loc, "msg": "JSON decode error", "input": {}}]
    )


async def _raw_body(request: Request) -> bytes:
    limit = request.app.state.harmony.settings.max_body_bytes
    try:
        return decompress(await request.body(), request.headers.get("content-encoding", ""), limit)
    except InferBodyError as error:
        raise HTTPException(error.status_code, str(error)) from None


async def read_json_body(request: Request, model: type[Model], *, required: bool) -> Model | None:
    """The body validated against `model`; None for an optional body that is empty or `null`."""
    raw = await _raw_body(request)
    if not raw:
        if required:
            raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
        return None
    value: Any = raw
    if _is_json(request.headers.get("content-type")):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as error:
            raise _decode_error(error.pos) from None
        except UnicodeDecodeError:
            raise _decode_error(None) from None
    if value is None and not required:
        return None
    try:
        return model.model_validate(value)
    except ValidationError as error:
        problems = [{**e, "loc": ("body", *e["loc"])} for e in error.errors(include_url=False)]
        raise RequestValidationError(problems) from None


def openapi_body(model: type[BaseModel], *, required: bool, title: str = "Body") -> dict[str, Any]:
    """The requestBody FastAPI would write for `model` declared in the signature."""
    reference = {"$ref": f"#/components/schemas/{model.__name__}"}
    if required:
        return {"requestBody": {"content": {"application/json": {"schema": reference}}, "required": True}}
    schema = {"anyOf": [reference, {"type": "null"}], "title": title}
    return {"requestBody": {"content": {"application/json": {"schema": schema}}}}
