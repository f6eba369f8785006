"""KServe V2 inference, model configuration, statistics and the repository index.

The infer endpoints build their response bytes themselves (server/core/v2_codec.py) instead of letting
FastAPI validate and re-serialize a response model: that is most of a request's Python time.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool
from harmony_mobile.server.core.schemas import (
    InferResponse,
    ModelConfig,
    ModelStatistics,
    RepositoryIndexRequest,
    RepositoryModel,
    StatisticsResponse,
    V2ErrorBody,
)
from harmony_mobile.server.core.v2_codec import (
    BINARY_TYPE,
    HEADER_LENGTH,
    HMFT_FORM,
    INPUT_NAME,
    JSON_FORM,
    JSON_TYPE,
    InferBodyError,
    check_requested,
    decompress,
    encode_response,
    maybe_gzip,
    parse_request,
    request_form,
    select_outputs,
)
from harmony_mobile.server.routes.deps import AnyPrincipalDep, StateDep, authenticate_header
from harmony_mobile.server.routes.v2_common import (
    check_features,
    check_request_tier,
    output_metadata,
    prediction_outputs,
    resolve_model,
    retry_after,
    tier_label,
)
from harmony_mobile.server.services.inference import QueueFull, VersionStats
from harmony_mobile.server.services.registry import ServedVersion
from harmony_mobile.server.services.state import ServerState
from starlette.requests import ClientDisconnect
from starlette.types import Receive

router = APIRouter(prefix="/v2", tags=["inference (KServe V2)"])

ERRORS = {code: {"model": V2ErrorBody} for code in (400, 401, 403, 404, 405, 413, 415, 422, 429, 503)}
LOOKUP_ERRORS = {code: {"model": V2ErrorBody} for code in (401, 403, 404, 405, 429, 503)}

INFER_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            JSON_TYPE: {"schema": {"$ref": "#/components/schemas/InferRequest"}},
            BINARY_TYPE: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "HMFT tensor (docs/PROTOCOL.md 5), or with Inference-Header-Content-Length"
                    " the V2 binary tensor extension: JSON InferRequest then raw input bytes; without"
                    " that header a body starting with '{' is a JSON InferRequest",
                }
            },
        },
    }
}
# The infer routes read their headers and token themselves (FastAPI's dependency resolution is a
# large share of a request's time); these lines only tell the OpenAPI document what they read.
INFER_OPENAPI = {
    **INFER_BODY,
    "security": [{"HTTPBearer": []}],
    "parameters": [
        {
            "name": "x-harmony-tier",
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": "tier of the phone (HMFT bodies)",
        },
        {
            "name": "inference-header-content-length",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "pattern": "^[0-9]{1,12}$"},
            "description": "V2 binary tensor extension: length of the JSON header at the start of the body",
        },
    ],
}


def _first_headers(scope: dict) -> dict[str, str]:
    """The request's headers by lowercase name, the first of repeated ones winning as in Starlette's
    `Headers.get`; one dict costs less than Starlette's scan of the list for every lookup."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in reversed(scope["headers"])}


async def _read_body(receive: Receive) -> bytes:
    """The whole body, as `Request.body` reads it, without its per-request stream machinery."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def infer(request: Request, name: str, version: str | None) -> Response:
    state: ServerState = request.app.state.harmony
    headers = _first_headers(request.scope)
    principal = await authenticate_header(state, headers.get("authorization"))
    length = headers.get(HEADER_LENGTH)
    if length is not None and not (length.isdigit() and len(length) <= 12):
        raise HTTPException(422, f"Inference-Header-Content-Length {length!r} is not a decimal byte count")
    model = state.registry.loaded(version) if name == state.settings.model_name else None
    if model is None:  # first use of a version reads its file and the store: not on the event loop
        model = await run_in_threadpool(resolve_model, state, name, version)
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    body = await _read_body(request.receive)
    try:
        body = decompress(body, headers.get("content-encoding", ""), state.settings.max_body_bytes)
        form = request_form(content_type, length, body)
        if form == JSON_FORM:
            # thousands of JSON numbers are CPU work: keep them off the event loop
            parsed = await run_in_threadpool(parse_request, content_type, None, body)
        else:
            parsed = parse_request(content_type, length, body)
        if form == HMFT_FORM:
            parsed.tier = headers.get("x-harmony-tier")
        tier_field = "X-Harmony-Tier" if form == HMFT_FORM else "parameters.tier"
        check_request_tier(state, principal, parsed.tier, tier_field)
        features = check_features(parsed.features, model, state.settings.max_request_rows)
        if parsed.requested is not None:
            check_requested([meta.name for meta in output_metadata(model)], parsed.requested)
    except InferBodyError as error:
        raise HTTPException(error.status_code, str(error)) from None
    try:
        prediction = await state.batcher.infer(features, model)
    except QueueFull as error:
        raise HTTPException(503, str(error), headers=retry_after(state)) from None
    if not prediction.finite:
        raise HTTPException(
            422, f"input {INPUT_NAME!r} is finite but so large that the model output overflows"
        )
    state.metrics.count_fallback_rows(tier_label(state, parsed.tier), features.shape[0])
    outputs = select_outputs(prediction_outputs(prediction), parsed.requested)
    content, response_headers = encode_response(name, prediction.model_version, parsed, outputs)
    content = maybe_gzip(content, response_headers, headers.get("accept-encoding", ""))
    return Response(content, headers=response_headers)


def _path_parameter(name: str) -> dict:
    """What FastAPI would write for a `str` path parameter in the signature (the infer endpoints read
    theirs from `request.path_params`: resolving signature parameters costs more than the rest of
    a single-row request's Python)."""
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string", "title": name.title()}}


def _infer_openapi(*path_parameters: str) -> dict:
    return {
        **INFER_OPENAPI,
        "parameters": [*map(_path_parameter, path_parameters), *INFER_OPENAPI["parameters"]],
    }


@router.post(
    "/models/{name}/infer",
    response_model=InferResponse,
    responses=ERRORS,
    openapi_extra=_infer_openapi("name"),
)
async def infer_default(request: Request) -> Response:
    """Infer with the default back-end version."""
    return await infer(request, request.path_params["name"], None)


@router.post(
    "/models/{name}/versions/{version}/infer",
    response_model=InferResponse,
    responses=ERRORS,
    openapi_extra=_infer_openapi("name", "version"),
)
async def infer_version(request: Request) -> Response:
    """Infer with one back-end version."""
    path = request.path_params
    return await infer(request, path["name"], path["version"])


# ---------------------------------------------------------------- configuration


def _config(state: ServerState, name: str, model: ServedVersion) -> ModelConfig:
    settings = state.settings
    return ModelConfig(
        name=name,
        # Triton's names for what runs the back-end (server/services/runtimes.py)
        platform="onnxruntime_onnx" if model.runtime == "onnx" else "pytorch_libtorch",
        backend="onnxruntime" if model.runtime == "onnx" else "pytorch",
        max_batch_size=settings.max_request_rows,
        input=[{"name": INPUT_NAME, "data_type": "TYPE_FP32", "dims": list(model.interface_shape)}],
        output=[
            {"name": o.name, "data_type": f"TYPE_{o.datatype}", "dims": o.shape[1:] or [1]}
            for o in output_metadata(model)
        ],
        dynamic_batching={
            "max_queue_delay_microseconds": int(settings.max_wait_ms * 1000),
            "preferred_batch_size": [settings.max_batch],
            "default_queue_policy": {"max_queue_size": settings.queue_size},
        },
        parameters={"model_version": {"string_value": model.version}},
    )


@router.get("/models/{name}/config", response_model=ModelConfig, responses=LOOKUP_ERRORS)
def model_config(name: str, state: StateDep, _: AnyPrincipalDep) -> ModelConfig:
    """Triton-style model configuration of the default version."""
    return _config(state, name, resolve_model(state, name, None))


@router.get("/models/{name}/versions/{version}/config", response_model=ModelConfig, responses=LOOKUP_ERRORS)
def model_version_config(name: str, version: str, state: StateDep, _: AnyPrincipalDep) -> ModelConfig:
    return _config(state, name, resolve_model(state, name, version))


# ---------------------------------------------------------------- statistics


def _duration(pair: list[int]) -> dict[str, int]:
    return {"count": pair[0], "ns": pair[1]}


def _model_stats(name: str, version: str, stats: VersionStats) -> ModelStatistics:
    zero = [0, 0]
    return ModelStatistics(
        name=name,
        version=version,
        last_inference=stats.last_inference_ms,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats={
            "success": _duration(stats.success),
            "fail": _duration(stats.fail),
            "queue": _duration(stats.queue),
            "compute_input": _duration(zero),
            "compute_infer": _duration(stats.compute_infer),
            "compute_output": _duration(zero),
            "cache_hit": _duration(zero),
            "cache_miss": _duration(zero),
        },
        batch_stats=[],
    )


def _statistics(state: ServerState, name: str | None, version: str | None) -> StatisticsResponse:
    if name is not None:
        resolve_model(state, name, version)  # 404 / 503 like every other model route
    counters = state.batcher.stats()
    versions = [version] if version is not None else state.registry.version_names()
    model_name = state.settings.model_name
    return StatisticsResponse(
        model_stats=[_model_stats(model_name, v, counters.get(v, VersionStats())) for v in versions]
    )


@router.get("/models/stats", response_model=StatisticsResponse, responses=LOOKUP_ERRORS)
def all_statistics(state: StateDep, _: AnyPrincipalDep) -> StatisticsResponse:
    """Inference statistics of every version (Triton's statistics extension; times in ns)."""
    return _statistics(state, None, None)


@router.get("/models/{name}/stats", response_model=StatisticsResponse, responses=LOOKUP_ERRORS)
def model_statistics(name: str, state: StateDep, _: AnyPrincipalDep) -> StatisticsResponse:
    return _statistics(state, name, None)


@router.get(
    "/models/{name}/versions/{version}/stats", response_model=StatisticsResponse, responses=LOOKUP_ERRORS
)
def model_version_statistics(
    name: str, version: str, state: StateDep, _: AnyPrincipalDep
) -> StatisticsResponse:
    return _statistics(state, name, version)


# ---------------------------------------------------------------- repository index


@router.post(
    "/repository/index",
    response_model=list[RepositoryModel],
    responses={code: {"model": V2ErrorBody} for code in (400, 401, 403, 405, 413, 422, 429)},
)
async def repository_index(
    state: StateDep, _: AnyPrincipalDep, body: Annotated[RepositoryIndexRequest | None, Body()] = None
) -> list[RepositoryModel]:
    """Every stored version of the one model. All load on demand, so all are READY and the `ready`
    filter of the request changes nothing."""
    versions = await run_in_threadpool(state.registry.version_names)
    return [RepositoryModel(name=state.settings.model_name, version=v, state="READY") for v in versions]
