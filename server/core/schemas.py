"""Request and response bodies (what the OpenAPI schema and docs/PROTOCOL.md describe).

Privacy boundary: no model here has a field that can carry a class label; uploads carry sealed
bytes, and the server-side metadata names label *tokens* only (tests/test_server_privacy.py).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from harmony_mobile.server.core.records import VersionRecord
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from harmony_mobile.models.constants import DISTILLATION_TEMPERATURE, SUPCON_TEMPERATURE
from harmony_mobile.protocol.label_tokens import LABEL_EPOCH_PATTERN

TIER_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
INT64_MAX = 2**63 - 1


def _number_not_text(value: object) -> object:
    if isinstance(value, str | bytes | bool):
        raise ValueError("must be a JSON number, not a string or a boolean")
    return value


# A JSON Schema integer: 3 and 3.0 are the same number (so the OpenAPI document is exact), "3" and
# true are not numbers. Strict mode alone would refuse 3.0; lax mode alone would take "3".
JsonInt = Annotated[int, Field(strict=False), BeforeValidator(_number_not_text)]


class _Strict(BaseModel):
    """Request bodies: unknown keys refused, no coercion ("3" is not an integer, 1.0 not a bool), and
    NaN or infinity is named as such (not as out of range)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# ---------------------------------------------------------------- errors and health


class ErrorBody(BaseModel):
    detail: str = Field(description="one sentence saying exactly what was wrong")


class V2ErrorBody(BaseModel):
    """The Open Inference Protocol's error body, used on every /v2 route."""

    error: str = Field(description="one sentence saying exactly what was wrong")


class LiveResponse(BaseModel):
    live: bool


class ReadyResponse(BaseModel):
    ready: bool


class ModelReadyResponse(BaseModel):
    name: str
    version: str | None = None
    ready: bool


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


# ---------------------------------------------------------------- KServe V2 inference


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class SlotParameters(BaseModel):
    label_epoch: str = Field(description="label epoch of the version's tokens (docs/PROTOCOL.md)")
    slot_table: list[str] = Field(
        description="slot i's label token at index i, 16 lowercase hex characters; a phone maps a slot to "
        "a class by computing the token of each class name under the epoch's key"
    )


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    parameters: SlotParameters


class InferInput(_Strict):
    name: str = Field(description="must be 'features'")
    shape: list[JsonInt] = Field(description="[N, 64, 8, 8]")
    datatype: str = Field(description="must be 'FP32'")
    data: list[Any] | None = Field(
        default=None,
        description="prod(shape) numbers, flat row-major (nested lists accepted); absent when"
        " parameters.binary_data_size says the values follow the JSON (binary tensor extension)",
    )
    parameters: dict[str, Any] | None = None


class InferRequestedOutput(_Strict):
    name: str
    parameters: dict[str, Any] | None = None


class InferRequest(_Strict):
    id: str | None = Field(default=None, max_length=256)
    inputs: list[InferInput] = Field(min_length=1, max_length=1, description="exactly one: 'features'")
    outputs: list[InferRequestedOutput] | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="optional: {'tier': '<tier name>'}")


class InferOutput(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[float] | list[int]


class InferResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[InferOutput]


class ModelConfig(BaseModel):
    """Triton-style model configuration (GET /v2/models/{name}/config)."""

    name: str
    platform: str
    backend: str
    max_batch_size: JsonInt = Field(description="rows per request (max_request_rows)")
    input: list[dict[str, Any]]
    output: list[dict[str, Any]]
    dynamic_batching: dict[str, Any]
    parameters: dict[str, Any]


class ModelStatistics(BaseModel):
    name: str
    version: str
    last_inference: int = Field(description="ms since the epoch of the last forward pass, 0 = never")
    inference_count: int = Field(description="rows inferred")
    execution_count: int = Field(description="forward passes (micro-batches)")
    inference_stats: dict[str, dict[str, int]] = Field(description="{'success': {'count', 'ns'}, ...}")
    batch_stats: list[dict[str, Any]]


class StatisticsResponse(BaseModel):
    model_stats: list[ModelStatistics]


class RepositoryIndexRequest(_Strict):
    ready: bool | None = None


class RepositoryModel(BaseModel):
    name: str
    version: str
    state: Literal["READY", "UNAVAILABLE"]


# ---------------------------------------------------------------- devices


class EnrolRequest(_Strict):
    name: str | None = Field(default=None, max_length=128)
    tier: str | None = Field(default=None, pattern=TIER_PATTERN)


class Limits(BaseModel):
    max_body_bytes: int
    max_request_rows: int
    max_upload_rows: int
    rate_limit_per_second: float
    rate_limit_burst: int


class EnrolResponse(BaseModel):
    device_id: str
    token: str = Field(description="bearer token, shown once; the server keeps only its SHA-256")
    server_public_key: str = Field(description="base64 of the raw 32-byte X25519 key uploads are sealed to")
    seal_version: int
    model_name: str
    default_version: str | None
    label_epoch: str | None = Field(description="label epoch of the default version: uploads name it")
    slot_table: list[str] | None = Field(description="the default version's slot table (hex tokens)")
    interface_shape: list[int] | None
    manifest: str | None = Field(description="verbatim text of manifest.json, or null")
    manifest_signature: str | None = Field(description="verbatim text of manifest.sig, or null")
    manifest_p256_signature: str | None = Field(
        default=None,
        description="verbatim text of manifest.p256.sig (ECDSA P-256, what Android verifies), or null",
    )
    limits: Limits


class DeviceInfo(BaseModel):
    device_id: str
    name: str | None
    tier: str | None
    created_at: str
    revoked_at: str | None


# ---------------------------------------------------------------- uploads


class UploadRequest(_Strict):
    label_epoch: str = Field(
        pattern=LABEL_EPOCH_PATTERN, description="label epoch whose key made every token inside"
    )
    # strict=False: JSON carries a UUID as a string, which strict mode would refuse
    message_id: uuid.UUID = Field(
        strict=False, description="fresh random UUID per upload; the idempotency key"
    )
    envelope: str = Field(min_length=1, description="base64 of the sealed envelope (docs/PROTOCOL.md 4.2)")

    @field_validator("message_id")
    @classmethod
    def not_nil(cls, value: uuid.UUID) -> uuid.UUID:
        if value.int == 0:
            raise ValueError("the nil UUID is not a fresh message id; send a random (v4) UUID")
        return value


class UploadReceiptResponse(BaseModel):
    upload_id: int
    message_id: str
    rows: int
    duplicate: bool
    received_at: str


# ---------------------------------------------------------------- alignment and registry


class AlignmentParams(_Strict):
    """One alignment round (server/services/alignment.py): slot CE + SupCon on the new stored rows, distillation
    to the current version on the replay rows (features it was trained on), and a two-part publish check."""

    steps: JsonInt = Field(default=60, ge=1, le=10_000, description="optimizer steps")
    batch_size: JsonInt = Field(default=64, ge=4, le=1024, description="new rows per step (and replay rows)")
    learning_rate: float = Field(default=1e-3, gt=0, le=1)
    temperature: float = Field(default=SUPCON_TEMPERATURE, gt=0, description="SupCon temperature")
    ce_weight: float = Field(
        default=1.0, ge=0, description="weight of the slot-space CE on the new rows (their tokens' slots)"
    )
    # off, as in training (docs/ALGORITHM.md section 9): training no longer trains the projection head
    # h that SupCon reads, so a round would start it from its initial weights
    contrastive_weight: float = Field(default=0.0, ge=0, description="weight of SupCon on the new rows")
    distill_weight: float = Field(
        default=1.0,
        ge=0,
        description="weight of distillation to the current version's predictions on the replay rows",
    )
    distill_temperature: float = Field(default=DISTILLATION_TEMPERATURE, gt=0)
    holdout_fraction: float = Field(
        default=0.2,
        gt=0,
        lt=1,
        description="share of new rows and of replay rows held out for the publish check",
    )
    min_replay_agreement: float = Field(
        default=0.9,
        ge=0,
        le=1,
        description="publish only if, on held-out replay rows, the new version picks the current"
        " version's slot at least this often (the slot mapping is kept)",
    )
    accuracy_tolerance: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="allowed drop of held-out slot accuracy of the new rows (top slot == the row's token's slot)",
    )
    require_replay: bool = Field(
        default=True,
        description="with no replay rows the slot mapping cannot be checked: reject the round (false:"
        " train without distillation and publish on held-out slot accuracy alone)",
    )
    max_rows: JsonInt = Field(default=20_000, ge=8, description="newest stored rows used by the round")
    min_rows: JsonInt = Field(default=16, ge=4, description="fewer new stored rows fail the round")
    seed: JsonInt = Field(default=0, ge=0, le=INT64_MAX)


RoundStatus = Literal["queued", "running", "published", "rejected", "failed", "interrupted"]


class RoundResponse(BaseModel):
    id: int
    status: RoundStatus
    progress: float
    params: dict[str, Any]
    parent_version: str | None
    new_version: str | None
    metrics: dict[str, Any]
    error: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None


# A version as the registry lists it: the store's record under the name the OpenAPI contract gives
# it. No docstring: pydantic would publish it as the schema's description.
class VersionInfo(VersionRecord):
    pass


class RegistryResponse(BaseModel):
    default: str | None
    versions: list[VersionInfo]


class SetDefaultRequest(_Strict):
    version: str
