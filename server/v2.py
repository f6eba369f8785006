"""KServe V2 / Open Inference Protocol endpoints: health, metadata and the inference fallback."""

from __future__ import annotations

import math
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Header, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from harmony_mobile.server.auth import AnyPrincipalDep
from harmony_mobile.server.inference import QueueFull
from harmony_mobile.server.registry import ServedModel, UnknownVersion
from harmony_mobile.server.schemas import (
    ErrorBody,
    InferOutput,
    InferRequest,
    InferResponse,
    LiveResponse,
    ModelMetadata,
    ModelReadyResponse,
    ReadyResponse,
    ServerMetadata,
    SlotParameters,
    TensorMetadata,
)
from harmony_mobile.server.state import ServerState, SettingsDep, StateDep
from pydantic import ValidationError

from harmony_mobile.federation.wire import WireFormatError, decode_tensor

INPUT_NAME = "features"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"

router = APIRouter(prefix="/v2", tags=["inference (KServe V2)"])

ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 403, 404, 413, 415, 422, 429, 503)}


def _unprocessable(message: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, message)


def _resolve_model(state: ServerState, name: str, version: str | None) -> ServedModel:
    if name != state.settings.model_name:
        raise HTTPException(404, f"unknown model {name!r}; this server serves {state.settings.model_name!r}")
    try:
        return state.registry.resolve(version)
    except UnknownVersion as error:
        if version is None:
            raise HTTPException(503, "no back-end is loaded yet", headers=_retry_after(state)) from None
        raise HTTPException(404, f"model {name!r} has {error}") from None


def _retry_after(state: ServerState) -> dict[str, str]:
    return {"Retry-After": str(state.settings.retry_after_seconds)}


def check_features(array: np.ndarray, model: ServedModel, max_rows: int) -> np.ndarray:
    """Shape, row count and finiteness; every failure says exactly what was wrong (422)."""
    expected = list(model.interface_shape)
    if array.ndim != 4 or list(array.shape[1:]) != expected:
        raise _unprocessable(
            f"input {INPUT_NAME!r} has shape {list(array.shape)}; expected [N, {', '.join(map(str, expected))}]"
        )
    if not 1 <= array.shape[0] <= max_rows:
        raise _unprocessable(f"input {INPUT_NAME!r} has {array.shape[0]} rows; the limit is 1..{max_rows}")
    finite = np.isfinite(array)
    if not finite.all():
        first = int(np.flatnonzero(~finite)[0])
        raise _unprocessable(
            f"input {INPUT_NAME!r} contains NaN or Inf (first at flat index {first}, value {array.flat[first]})"
        )
    return np.ascontiguousarray(array, dtype=np.float32)


def features_from_json(request: InferRequest, model: ServedModel, max_rows: int) -> np.ndarray:
    if len(request.inputs) != 1:
        raise _unprocessable(f"expected exactly one input named {INPUT_NAME!r}, got {len(request.inputs)}")
    tensor = request.inputs[0]
    if tensor.name != INPUT_NAME:
        raise _unprocessable(f"unknown input {tensor.name!r}; this model's input is named {INPUT_NAME!r}")
    if tensor.datatype != "FP32":
        raise _unprocessable(
            f"input {INPUT_NAME!r} has datatype {tensor.datatype!r}; this model accepts 'FP32' only"
        )
    if any(d < 1 for d in tensor.shape):
        raise _unprocessable(f"input {INPUT_NAME!r} has shape {tensor.shape}; every dimension must be >= 1")
    expected_count = math.prod(tensor.shape)
    try:
        values = np.asarray(tensor.data, dtype=np.float32)
    except (ValueError, TypeError):
        raise _unprocessable(
            f"input {INPUT_NAME!r} data must be numbers (flat, or nested lists of equal length)"
        ) from None
    if values.size != expected_count:
        raise _unprocessable(
            f"input {INPUT_NAME!r} holds {values.size} values; shape {tensor.shape} needs {expected_count}"
        )
    return check_features(values.reshape(tensor.shape), model, max_rows)


def _tier_label(state: ServerState, tier: object) -> str:
    return tier if isinstance(tier, str) and tier in state.known_tiers else "other"


def _response(prediction, request_id: str | None, model_name: str) -> InferResponse:
    """Scores over slots, never over named classes: a phone maps the top slot to a class with its
    federation secret (docs/PROTOCOL.md, slot table)."""
    n, slots = prediction.slot_scores.shape
    return InferResponse(
        model_name=model_name,
        model_version=prediction.model_version,
        id=request_id,
        outputs=[
            InferOutput(
                name="slot_scores",
                datatype="FP32",
                shape=[n, slots],
                data=prediction.slot_scores.ravel().tolist(),
            ),
            InferOutput(name="top_slot", datatype="INT64", shape=[n], data=prediction.top_slot.tolist()),
            InferOutput(name="confidence", datatype="FP32", shape=[n], data=prediction.confidence.tolist()),
        ],
    )


# ---------------------------------------------------------------- health and metadata


@router.get("/health/live", response_model=LiveResponse)
def live() -> LiveResponse:
    return LiveResponse(live=True)


@router.get("/health/ready", response_model=ReadyResponse, responses={503: {"model": ReadyResponse}})
def ready(state: StateDep, settings: SettingsDep):
    if state.registry.default() is None:
        headers = {"Retry-After": str(settings.retry_after_seconds)}
        return JSONResponse({"ready": False}, status_code=503, headers=headers)
    return ReadyResponse(ready=True)


@router.get("", response_model=ServerMetadata)
def server_metadata() -> ServerMetadata:
    from importlib.metadata import version

    return ServerMetadata(
        name="harmony-mobile", version=version("harmony-mobile"), extensions=["harmony-binary-tensor"]
    )


def _metadata(state: ServerState, model: ServedModel, name: str) -> ModelMetadata:
    shape = list(model.interface_shape)
    return ModelMetadata(
        name=name,
        versions=state.registry.version_names(),
        platform="pytorch",
        inputs=[TensorMetadata(name=INPUT_NAME, datatype="FP32", shape=[-1, *shape])],
        outputs=[
            TensorMetadata(name="slot_scores", datatype="FP32", shape=[-1, len(model.slot_table)]),
            TensorMetadata(name="top_slot", datatype="INT64", shape=[-1]),
            TensorMetadata(name="confidence", datatype="FP32", shape=[-1]),
        ],
        parameters=SlotParameters(label_epoch=model.label_epoch, slot_table=model.slot_table.to_hex()),
    )


@router.get("/models/{name}", response_model=ModelMetadata, responses=ERRORS)
def model_metadata(name: str, state: StateDep, _: AnyPrincipalDep) -> ModelMetadata:
    return _metadata(state, _resolve_model(state, name, None), name)


@router.get("/models/{name}/versions/{version}", response_model=ModelMetadata, responses=ERRORS)
def model_version_metadata(name: str, version: str, state: StateDep, _: AnyPrincipalDep) -> ModelMetadata:
    return _metadata(state, _resolve_model(state, name, version), name)


@router.get("/models/{name}/ready", response_model=ModelReadyResponse, responses=ERRORS)
def model_ready(name: str, state: StateDep, _: AnyPrincipalDep) -> ModelReadyResponse:
    model = _resolve_model(state, name, None)
    return ModelReadyResponse(name=name, version=model.version, ready=True)


@router.get("/models/{name}/versions/{version}/ready", response_model=ModelReadyResponse, responses=ERRORS)
def model_version_ready(name: str, version: str, state: StateDep, _: AnyPrincipalDep) -> ModelReadyResponse:
    model = _resolve_model(state, name, version)
    return ModelReadyResponse(name=name, version=model.version, ready=True)


# ---------------------------------------------------------------- inference

INFER_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            JSON_TYPE: {"schema": {"$ref": "#/components/schemas/InferRequest"}},
            BINARY_TYPE: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "HMFT tensor (docs/PROTOCOL.md 5)",
                }
            },
        },
    }
}


async def _infer(
    request: Request, state: ServerState, name: str, version: str | None, tier_header: str | None
) -> InferResponse:
    model = state.registry.loaded(version) if name == state.settings.model_name else None
    if model is None:  # first use of a version reads its file and the store: not on the event loop
        model = await run_in_threadpool(_resolve_model, state, name, version)
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await request.body()
    max_rows = state.settings.max_request_rows
    request_id = None
    if content_type == BINARY_TYPE:
        try:
            array = decode_tensor(body)
        except WireFormatError as error:
            raise HTTPException(400, f"malformed binary body: {error}") from None
        features = check_features(array, model, max_rows)
        tier = tier_header
    elif content_type == JSON_TYPE:
        # Parsing thousands of JSON numbers is CPU work: keep it off the event loop too.
        infer_request, features = await run_in_threadpool(_parse_json_request, body, model, max_rows)
        request_id = infer_request.id
        tier = (infer_request.parameters or {}).get("tier")
    else:
        raise HTTPException(
            415,
            f"content type {content_type or '(none)'!r} is not accepted; send {JSON_TYPE} or {BINARY_TYPE}",
        )
    try:
        prediction = await state.batcher.infer(features, model)
    except QueueFull as error:
        raise HTTPException(503, str(error), headers=_retry_after(state)) from None
    state.metrics.fallbacks.labels(_tier_label(state, tier)).inc(features.shape[0])
    return _response(prediction, request_id, name)


def _parse_json_request(body: bytes, model: ServedModel, max_rows: int) -> tuple[InferRequest, np.ndarray]:
    try:
        infer_request = InferRequest.model_validate_json(body)
    except ValidationError as error:
        raise _unprocessable(f"invalid infer request: {_validation_summary(error)}") from None
    return infer_request, features_from_json(infer_request, model, max_rows)


def _validation_summary(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in error.errors())


@router.post("/models/{name}/infer", response_model=InferResponse, responses=ERRORS, openapi_extra=INFER_BODY)
async def infer_default(
    name: str,
    request: Request,
    state: StateDep,
    _: AnyPrincipalDep,
    x_harmony_tier: Annotated[str | None, Header(description="tier of the phone (binary bodies)")] = None,
) -> InferResponse:
    """Infer with the default back-end version."""
    return await _infer(request, state, name, None, x_harmony_tier)


@router.post(
    "/models/{name}/versions/{version}/infer",
    response_model=InferResponse,
    responses=ERRORS,
    openapi_extra=INFER_BODY,
)
async def infer_version(
    name: str,
    version: str,
    request: Request,
    state: StateDep,
    _: AnyPrincipalDep,
    x_harmony_tier: Annotated[str | None, Header(description="tier of the phone (binary bodies)")] = None,
) -> InferResponse:
    """Infer with one back-end version."""
    return await _infer(request, state, name, version, x_harmony_tier)
