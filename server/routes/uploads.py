"""Sealed feature uploads: authenticate, open, validate, store durably, answer 201 (docs/PROTOCOL.md 4).

The endpoint is a plain `def`, so FastAPI runs it in the thread pool: decryption and the fsync of
the SQLite commit never block the event loop. Logs name the device, message id and row count,
never feature values or tokens.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, Response, status
from harmony_mobile.server.core.schemas import ErrorBody, UploadReceiptResponse, UploadRequest
from harmony_mobile.server.routes.bodies import openapi_body, read_json_body
from harmony_mobile.server.routes.deps import DeviceDep, Principal, StateDep
from harmony_mobile.server.services.store import NewUpload, UploadReceipt
from harmony_mobile.server.services.uploads import (
    UploadRejected,
    check_label_epoch,
    check_payload,
    check_protections,
    check_provenance,
    known_versions,
    lineage_protections,
    open_upload,
)

from harmony_mobile.models import InterfaceSpec
from harmony_mobile.protocol.wire import UploadPayload

log = logging.getLogger("harmony_mobile.server.uploads")
router = APIRouter(prefix="/v1", tags=["uploads"])
ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 403, 409, 413, 422, 429)}


def _receipt(receipt: UploadReceipt, duplicate: bool) -> UploadReceiptResponse:
    return UploadReceiptResponse(
        upload_id=receipt.upload_id,
        message_id=receipt.message_id,
        rows=receipt.rows,
        duplicate=duplicate,
        received_at=receipt.received_at,
    )


async def _upload_body(request: Request, _: DeviceDep) -> UploadRequest:
    """The body, read after the device token was checked (docs/PROTOCOL.md 4.5 step 1)."""
    return await read_json_body(request, UploadRequest, required=True)


UploadBody = Annotated[UploadRequest, Depends(_upload_body)]


@router.post(
    "/uploads",
    status_code=status.HTTP_201_CREATED,
    response_model=UploadReceiptResponse,
    responses={
        **ERRORS,
        200: {"model": UploadReceiptResponse, "description": "replay of a stored message id"},
    },
    openapi_extra=openapi_body(UploadRequest, required=True),
)
def upload(
    principal: DeviceDep, body: UploadBody, response: Response, state: StateDep
) -> UploadReceiptResponse:
    """Store a sealed batch of features + label tokens; 201 only after the commit."""
    device_id, message_id = principal.device_id, str(body.message_id)
    try:
        envelope = base64.b64decode(body.envelope, validate=True)
    except (binascii.Error, ValueError):
        state.metrics.uploads.labels("rejected").inc()
        raise HTTPException(400, "envelope is not valid base64 (standard alphabet, padded)") from None
    digest = hashlib.sha256(envelope).hexdigest()

    existing = state.store.find_upload(device_id, message_id)
    if existing is not None:
        return _replay(existing, digest, response, state)

    payload = _checked_payload(state, principal, body, envelope)
    meta = payload.metadata
    receipt, inserted = state.store.add_upload(
        NewUpload(
            device_id=device_id,
            message_id=message_id,
            label_epoch=body.label_epoch,
            envelope=envelope,
            envelope_sha256=digest,
            rows=payload.features.shape[0],
            tier=meta.tier,
            family=meta.family,
            model_version=meta.model_version,
            clip_norm=meta.clip_norm,
            noise_multiplier=meta.noise_multiplier,
            label_dp_epsilon=meta.label_dp_epsilon,
        )
    )
    if not inserted:  # a concurrent replay committed first
        return _replay(receipt, digest, response, state)
    state.metrics.uploads.labels("accepted").inc()
    state.metrics.upload_rows.inc(receipt.rows)
    state.metrics.upload_bytes.inc(len(envelope))
    log.info(
        "upload stored: device=%s message=%s rows=%d id=%d",
        device_id,
        message_id,
        receipt.rows,
        receipt.upload_id,
    )
    return _receipt(receipt, duplicate=False)


def _checked_payload(state, principal: Principal, body: UploadRequest, envelope: bytes) -> UploadPayload:
    """The opened envelope, checked against the device's tier and the served lineage; an HTTP error
    (400 or 422) when any check refuses it."""
    device_id, message_id = principal.device_id, str(body.message_id)
    default = state.registry.default()
    try:
        payload = open_upload(state.server_key, device_id, body.label_epoch, message_id, envelope)
        # Without a loaded back-end, hold uploads to the project's interface shape (64x8x8).
        interface_shape = default.interface_shape if default else InterfaceSpec().shape
        check_payload(payload, interface_shape, state.settings.max_upload_rows)
        check_provenance(payload.metadata, principal.tier, state.served.tiers, known_versions(state))
        check_label_epoch(state, body.label_epoch, payload.metadata)
        required = lineage_protections(state, body.label_epoch, payload.metadata)
        check_protections(payload.metadata, required, body.label_epoch)
    except UploadRejected as error:
        state.metrics.uploads.labels("rejected").inc()
        log.info("upload rejected: device=%s message=%s status=%d", device_id, message_id, error.status_code)
        raise HTTPException(error.status_code, str(error)) from None
    return payload


def _replay(existing: UploadReceipt, digest: str, response: Response, state) -> UploadReceiptResponse:
    if existing.envelope_sha256 != digest:
        state.metrics.uploads.labels("rejected").inc()
        raise HTTPException(
            409,
            f"message id {existing.message_id} was already used for a different envelope; use a fresh UUID",
        )
    state.metrics.uploads.labels("duplicate").inc()
    response.status_code = status.HTTP_200_OK
    return _receipt(existing, duplicate=True)
