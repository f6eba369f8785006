"""KServe V2 / Open Inference Protocol endpoints: health, metadata and the inference fallback."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, HTTPException, status
from fastapi.responses import JSONResponse
from harmony_mobile.server.auth import AnyPrincipalDep, Principal
from harmony_mobile.server.inference import Prediction
from harmony_mobile.server.registry import ServedVersion, UnknownVersion
from harmony_mobile.server.schemas import (
    LiveResponse,
    ModelMetadata,
    ModelReadyResponse,
    ReadyResponse,
    ServerMetadata,
    SlotParameters,
    TensorMetadata,
    V2ErrorBody,
)
from harmony_mobile.server.state import ServerState, SettingsDep, StateDep
from harmony_mobile.server.v2_codec import INPUT_NAME, OutputTensor

# binary_tensor_data, statistics: the KServe/Triton extension names; harmony-binary-tensor: HMFT bodies
EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration", "harmony-binary-tensor"]

router = APIRouter(prefix="/v2", tags=["inference (KServe V2)"])

ERRORS = {code: {"model": V2ErrorBody} for code in (401, 403, 404, 405, 429, 503)}


def _unprocessable(message: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, message)


def _resolve_model(state: ServerState, name: str, version: str | None) -> ServedVersion:
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


def check_features(array: np.ndarray, model: ServedVersion, max_rows: int) -> np.ndarray:
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


def check_request_tier(state: ServerState, principal: Principal, tier: object, field: str) -> None:
    """A tier an infer request names (`parameters.tier`, `X-Harmony-Tier`) is the phone's own: one
    the server serves, and the one the device was enrolled with (422 naming the field otherwise)."""
    if tier is None:
        return
    if not isinstance(tier, str):
        raise _unprocessable(f"{field} must be a string (a tier name), got {tier!r}")
    known = state.served.tiers
    if tier not in known:
        raise _unprocessable(
            f"{field} {tier!r} is not a tier of this server (known: {', '.join(sorted(known))})"
        )
    if principal.tier is not None and tier != principal.tier:
        raise _unprocessable(
            f"{field} {tier!r} is not the tier {principal.tier!r} this device was enrolled with"
        )


def _tier_label(state: ServerState, tier: object) -> str:
    return tier if isinstance(tier, str) and tier in state.known_tiers else "other"


def prediction_outputs(prediction: Prediction) -> list[OutputTensor]:
    """The model's outputs, in the order metadata lists them (the one place that names them). Scores
    are over slots, never over named classes: a phone maps the top slot to a class with its federation
    secret (docs/PROTOCOL.md, slot table)."""
    return [
        OutputTensor("slot_scores", "FP32", prediction.slot_scores),
        OutputTensor("top_slot", "INT64", prediction.top_slot),
        OutputTensor("confidence", "FP32", prediction.confidence),
    ]


def output_metadata(model: ServedVersion) -> list[TensorMetadata]:
    return [
        TensorMetadata(name="slot_scores", datatype="FP32", shape=[-1, len(model.slot_table)]),
        TensorMetadata(name="top_slot", datatype="INT64", shape=[-1]),
        TensorMetadata(name="confidence", datatype="FP32", shape=[-1]),
    ]


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
