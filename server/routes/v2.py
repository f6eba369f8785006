"""KServe V2 / Open Inference Protocol endpoints: health, metadata and the inference fallback."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from harmony_mobile.server.core.schemas import (
    LiveResponse,
    ModelMetadata,
    ModelReadyResponse,
    ReadyResponse,
    ServerMetadata,
    SlotParameters,
    TensorMetadata,
    V2ErrorBody,
)
from harmony_mobile.server.core.v2_codec import INPUT_NAME
from harmony_mobile.server.routes.deps import AnyPrincipalDep, SettingsDep, StateDep
from harmony_mobile.server.routes.v2_common import output_metadata, resolve_model
from harmony_mobile.server.services.registry import ServedVersion
from harmony_mobile.server.services.state import ServerState

# binary_tensor_data, statistics: the KServe/Triton extension names; harmony-binary-tensor: HMFT bodies
EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration", "harmony-binary-tensor"]

router = APIRouter(prefix="/v2", tags=["inference (KServe V2)"])

ERRORS = {code: {"model": V2ErrorBody} for code in (401, 403, 404, 405, 429, 503)}


# ---------------------------------------------------------------- health and metadata


@router.get("/health/live", response_model=LiveResponse)
async def live() -> LiveResponse:
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

    return ServerMetadata(name="harmony-mobile", version=version("harmony-mobile"), extensions=EXTENSIONS)


def _metadata(state: ServerState, model: ServedVersion, name: str) -> ModelMetadata:
    shape = list(model.interface_shape)
    return ModelMetadata(
        name=name,
        versions=state.registry.version_names(),
        platform="pytorch",
        inputs=[TensorMetadata(name=INPUT_NAME, datatype="FP32", shape=[-1, *shape])],
        outputs=output_metadata(model),
        parameters=SlotParameters(label_epoch=model.label_epoch, slot_table=model.slot_table.to_hex()),
    )


@router.get("/models/{name}", response_model=ModelMetadata, responses=ERRORS)
def model_metadata(name: str, state: StateDep, _: AnyPrincipalDep) -> ModelMetadata:
    return _metadata(state, resolve_model(state, name, None), name)


@router.get("/models/{name}/versions/{version}", response_model=ModelMetadata, responses=ERRORS)
def model_version_metadata(name: str, version: str, state: StateDep, _: AnyPrincipalDep) -> ModelMetadata:
    return _metadata(state, resolve_model(state, name, version), name)


@router.get("/models/{name}/ready", response_model=ModelReadyResponse, responses=ERRORS)
def model_ready(name: str, state: StateDep, _: AnyPrincipalDep) -> ModelReadyResponse:
    model = resolve_model(state, name, None)
    return ModelReadyResponse(name=name, version=model.version, ready=True)


@router.get("/models/{name}/versions/{version}/ready", response_model=ModelReadyResponse, responses=ERRORS)
def model_version_ready(name: str, version: str, state: StateDep, _: AnyPrincipalDep) -> ModelReadyResponse:
    model = resolve_model(state, name, version)
    return ModelReadyResponse(name=name, version=model.version, ready=True)
