"""Sealed feature uploads, apart from HTTP: open an envelope, check it against the device's tier and
the served lineage (docs/PROTOCOL.md 4), and turn a stored one into what the alignment worker reads.
The endpoint is server/routes/uploads.py."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from harmony_mobile.server.core.records import StoredEnvelope
from harmony_mobile.server.services.registry import UnknownVersion
from harmony_mobile.server.services.served_tiers import RUN_PROTECTIONS, ServedTier

from harmony_mobile.models import FAMILIES
from harmony_mobile.protocol.sealing import AssociatedData, SealError, open_sealed
from harmony_mobile.protocol.wire import UploadMetadata, UploadPayload, WireFormatError, decode_upload

if TYPE_CHECKING:  # the alignment worker's message type holds torch tensors; a serving replica has no torch
    from harmony_mobile.protocol.messages import FeatureUpload


class UploadRejected(ValueError):
    def __init__(self, status_code: int, message: str):
        self.status_code = status_code
        super().__init__(message)


def open_upload(
    server_key: X25519PrivateKey, device_id: str, label_epoch: str, message_id: str, envelope: bytes
) -> UploadPayload:
    """Decrypt and decode an envelope (400 on any layout or authentication failure). The associated
    data binds the envelope to the device, the label epoch its tokens were made under, and the message."""
    ad = AssociatedData(device_id, label_epoch, uuid.UUID(message_id))
    try:
        return decode_upload(open_sealed(server_key, envelope, ad))
    except SealError as error:
        raise UploadRejected(400, f"sealed envelope rejected: {error}") from None
    except WireFormatError as error:
        raise UploadRejected(400, f"upload payload is malformed: {error}") from None


def check_payload(payload: UploadPayload, interface_shape: tuple[int, ...], max_rows: int) -> None:
    rows = payload.features.shape[0]
    if rows > max_rows:
        raise UploadRejected(422, f"upload has {rows} rows; the limit is {max_rows} (max_upload_rows)")
    if tuple(payload.features.shape[1:]) != tuple(interface_shape):
        raise UploadRejected(
            422,
            f"upload features have shape {list(payload.features.shape)}; expected [N, {', '.join(map(str, interface_shape))}]",
        )
    if not np.isfinite(payload.features).all():
        raise UploadRejected(422, "upload features contain NaN or Inf")


def check_provenance(
    meta: UploadMetadata, enrolled_tier: str | None, tiers: dict[str, ServedTier], known_versions: set[str]
) -> None:
    """The metadata must name what this server knows: a registered model version (a phone's own
    personalized build of it may add "+<local build>"), the device's enrolled tier, and that tier's
    family and split depth."""
    base_version = meta.model_version.split("+", 1)[0]
    if base_version not in known_versions:
        raise UploadRejected(
            422,
            f"model_version {meta.model_version!r} is not a registered version"
            f" (known: {', '.join(sorted(known_versions)) or 'none'})",
        )
    if enrolled_tier is not None and meta.tier != enrolled_tier:
        raise UploadRejected(
            422, f"upload tier {meta.tier!r} is not the tier {enrolled_tier!r} this device was enrolled with"
        )
    if meta.tier not in tiers:
        raise UploadRejected(422, f"unknown tier {meta.tier!r}; known: {', '.join(sorted(tiers))}")
    tier = tiers[meta.tier]
    allowed = (tier.family,) if tier.family is not None else FAMILIES
    if meta.family not in allowed:
        raise UploadRejected(
            422, f"family {meta.family!r} does not match tier {meta.tier!r} (expected {' or '.join(allowed)})"
        )
    wrong = [d for d in meta.split_depths if tier.split_depth is not None and d != tier.split_depth]
    if wrong:
        raise UploadRejected(
            422,
            f"split_depths holds {wrong[0]}; tier {meta.tier!r} extracts every row at split depth"
            f" {tier.split_depth}",
        )


def check_protections(meta: UploadMetadata, required: dict[str, float], label_epoch: str) -> None:
    """Noise is recorded as a multiple of the clip norm (std = noise_multiplier * clip_norm), so a
    noise_multiplier without clip_norm says nothing about the noise the rows carry. `required`: the
    protections the served manifest's `run` applies to this upload's lineage; a row released with
    other ones would fall outside the guarantee the lineage publishes (and outside the feature
    distribution its back-end trained on)."""
    if meta.noise_multiplier is not None and meta.clip_norm is None:
        raise UploadRejected(
            422, "noise_multiplier needs clip_norm: the noise std is noise_multiplier * clip_norm"
        )
    for key, value in required.items():
        declared = getattr(meta, key)
        if declared != value:
            raise UploadRejected(
                422,
                f"{key} is {'missing' if declared is None else repr(declared)}; uploads of label epoch"
                f" {label_epoch!r} apply the served manifest's run.{RUN_PROTECTIONS[key]} = {value!r}",
            )


def lineage_protections(state, label_epoch: str, meta: UploadMetadata) -> dict[str, float]:
    """The manifest's protections if the upload is of the manifest's lineage (its label epoch, or
    its model version when the manifest names no epoch), else none."""
    served = state.served
    if served.label_epoch is not None:
        return served.protections if label_epoch == served.label_epoch else {}
    same_version = meta.model_version.split("+", 1)[0] == state.manifest_version
    return served.protections if same_version else {}


def version_label_epoch(state, base_version: str) -> str | None:
    """The label epoch of a known front-end version: the manifest's for its own version, else the
    registered back-end's (every version of a lineage shares its epoch); None if nothing says."""
    if base_version == state.manifest_version and state.served.label_epoch is not None:
        return state.served.label_epoch
    default = state.registry.default()
    if default is not None and default.version == base_version:
        return default.label_epoch
    try:
        return state.registry.get(base_version).label_epoch
    except UnknownVersion:  # the manifest's version without a back-end of that name
        return None


def check_label_epoch(state, label_epoch: str, meta: UploadMetadata) -> None:
    """Tokens of another epoch than the named version's would never meet that lineage's slots."""
    expected = version_label_epoch(state, meta.model_version.split("+", 1)[0])
    if expected is not None and label_epoch != expected:
        raise UploadRejected(
            422,
            f"label_epoch {label_epoch!r} is not the label epoch {expected!r} of model_version"
            f" {meta.model_version!r}",
        )


def known_versions(state) -> set[str]:
    versions = set(state.registry.version_names())
    if state.manifest_version is not None:
        versions.add(state.manifest_version)
    return versions


def stored_to_feature_upload(server_key: X25519PrivateKey, stored: StoredEnvelope) -> FeatureUpload:
    """The alignment worker's view of a stored upload: the message type the simulation also passes."""
    payload = open_upload(
        server_key, stored.device_id, stored.label_epoch, stored.message_id, stored.envelope
    )
    return payload.to_feature_upload(stored.device_id, stored.label_epoch, stored.upload_id)
