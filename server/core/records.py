"""The rows the store reads and writes, as plain frozen records (server/services/store.py holds the
database itself): what the API schemas and the token cache use without depending on the store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DeviceRecord:
    id: str
    name: str | None
    tier: str | None
    created_at: str
    revoked_at: str | None


@dataclass(frozen=True)
class UploadReceipt:
    upload_id: int
    message_id: str
    rows: int
    received_at: str
    envelope_sha256: str


@dataclass(frozen=True)
class NewUpload:
    device_id: str
    message_id: str
    label_epoch: str
    envelope: bytes
    envelope_sha256: str
    rows: int
    tier: str
    family: str
    model_version: str
    clip_norm: float | None
    noise_multiplier: float | None
    label_dp_epsilon: float | None = None


@dataclass(frozen=True)
class StoredEnvelope:
    """What the alignment worker reads back: enough to rebuild the AD and open the envelope."""

    upload_id: int
    device_id: str
    message_id: str
    label_epoch: str
    envelope: bytes


@dataclass(frozen=True)
class RoundRecord:
    id: int
    status: str
    params: dict[str, Any]
    parent_version: str | None
    new_version: str | None
    progress: float
    metrics: dict[str, Any]
    error: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None


@dataclass(frozen=True)
class VersionRecord:
    version: str
    sha256: str
    parent: str | None
    source: str
    created_at: str
    metrics: dict[str, Any]
