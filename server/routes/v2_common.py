"""What the KServe V2 endpoints of server/routes/v2.py and server/routes/v2_infer.py share: the model
a request names, the checks of its input and tier, and the outputs the model answers with."""

from __future__ import annotations

import numpy as np
from fastapi import HTTPException, status
from harmony_mobile.server.core.schemas import TensorMetadata
from harmony_mobile.server.core.v2_codec import INPUT_NAME, OutputTensor
from harmony_mobile.server.routes.deps import Principal
from harmony_mobile.server.services.inference import Prediction
from harmony_mobile.server.services.registry import ServedVersion, UnknownVersion
from harmony_mobile.server.services.state import ServerState


def _unprocessable(message: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, message)


def resolve_model(state: ServerState, name: str, version: str | None) -> ServedVersion:
    if name != state.settings.model_name:
        raise HTTPException(404, f"unknown model {name!r}; this server serves {state.settings.model_name!r}")
    try:
        return state.registry.resolve(version)
    except UnknownVersion as error:
        if version is None:
            raise HTTPException(503, "no back-end is loaded yet", headers=retry_after(state)) from None
        raise HTTPException(404, f"model {name!r} has {error}") from None


def retry_after(state: ServerState) -> dict[str, str]:
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


def tier_label(state: ServerState, tier: object) -> str:
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
