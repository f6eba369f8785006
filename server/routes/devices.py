"""Device enrolment, listing and revocation (admin), and the manifest for devices."""

from __future__ import annotations

import base64
import secrets
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, Response, status
from harmony_mobile.server.core.schemas import DeviceInfo, EnrolRequest, EnrolResponse, ErrorBody, Limits
from harmony_mobile.server.core.security import hash_token, new_device_token
from harmony_mobile.server.routes.bodies import openapi_body, read_json_body
from harmony_mobile.server.routes.deps import AdminDep, AnyPrincipalDep, StateDep, StoreDep

from harmony_mobile.protocol.sealing import ENVELOPE_VERSION, public_key_bytes

router = APIRouter(prefix="/v1", tags=["devices"])
ERRORS = {code: {"model": ErrorBody} for code in (401, 403, 404, 413, 422)}


async def _enrol_body(request: Request, _: AdminDep) -> EnrolRequest | None:
    """The optional body, read after the admin token was checked."""
    return await read_json_body(request, EnrolRequest, required=False)


@router.post(
    "/devices",
    status_code=status.HTTP_201_CREATED,
    response_model=EnrolResponse,
    responses=ERRORS,
    openapi_extra=openapi_body(EnrolRequest, required=False),
)
def enrol(
    state: StateDep, _: AdminDep, body: Annotated[EnrolRequest | None, Depends(_enrol_body)]
) -> EnrolResponse:
    """Enrol a device: a fresh id and bearer token, the server's sealing key and the current manifest.
    The body and both its fields are optional."""
    body = body or EnrolRequest()
    known = state.served.tiers
    if body.tier is not None and body.tier not in known:
        # a device of an unknown tier could never upload (its rows must be of its enrolled tier)
        raise HTTPException(
            422, f"tier {body.tier!r} is not a tier of this server (known: {', '.join(sorted(known))})"
        )
    token = new_device_token()
    device = state.store.add_device(f"dev_{secrets.token_hex(8)}", hash_token(token), body.name, body.tier)
    default = state.registry.default()
    settings = state.settings
    return EnrolResponse(
        device_id=device.id,
        token=token,
        server_public_key=base64.b64encode(public_key_bytes(state.server_key)).decode(),
        seal_version=ENVELOPE_VERSION,
        model_name=settings.model_name,
        default_version=default.version if default else None,
        label_epoch=default.label_epoch if default else None,
        slot_table=default.slot_table.to_hex() if default else None,
        interface_shape=list(default.interface_shape) if default else None,
        manifest=state.manifest_text,
        manifest_signature=state.manifest_signature,
        manifest_p256_signature=state.manifest_p256_signature,
        limits=Limits(
            max_body_bytes=settings.max_body_bytes,
            max_request_rows=settings.max_request_rows,
            max_upload_rows=settings.max_upload_rows,
            rate_limit_per_second=settings.rate_limit_per_second,
            rate_limit_burst=settings.rate_limit_burst,
        ),
    )


@router.get("/devices", response_model=list[DeviceInfo], responses=ERRORS)
def list_devices(store: StoreDep, _: AdminDep) -> list[DeviceInfo]:
    return [
        DeviceInfo(device_id=d.id, name=d.name, tier=d.tier, created_at=d.created_at, revoked_at=d.revoked_at)
        for d in store.devices()
    ]


@router.delete("/devices/{device_id}", status_code=status.HTTP_204_NO_CONTENT, responses=ERRORS)
def revoke_device(device_id: str, state: StateDep, _: AdminDep) -> Response:
    """Revoke a device token; its next request is 401. Its stored uploads stay."""
    if not state.store.revoke_device(device_id):
        raise HTTPException(404, f"unknown device {device_id!r}")
    state.token_cache.forget_device(device_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/manifest",
    responses={
        **ERRORS,
        200: {"content": {"application/json": {}}, "description": "manifest.json, verbatim"},
    },
)
def manifest(state: StateDep, _: AnyPrincipalDep) -> Response:
    """The exported manifest.json, byte for byte (its signature covers these exact bytes)."""
    if state.manifest_text is None:
        raise HTTPException(404, "this server has no manifest (no manifest.json in the model dir)")
    return Response(state.manifest_text.encode("utf-8"), media_type="application/json")


@router.get(
    "/manifest.sig", responses={**ERRORS, 200: {"content": {"text/plain": {}}, "description": "manifest.sig"}}
)
def manifest_signature(state: StateDep, _: AnyPrincipalDep) -> Response:
    if state.manifest_signature is None:
        raise HTTPException(404, "this server has no manifest signature (no manifest.sig in the model dir)")
    return Response(state.manifest_signature, media_type="text/plain")


@router.get(
    "/manifest.p256.sig",
    responses={**ERRORS, 200: {"content": {"text/plain": {}}, "description": "manifest.p256.sig"}},
)
def manifest_p256_signature(state: StateDep, _: AnyPrincipalDep) -> Response:
    """The export's ECDSA P-256 signature file (what Android verifies), verbatim."""
    if state.manifest_p256_signature is None:
        raise HTTPException(
            404, "this server has no P-256 manifest signature (no manifest.p256.sig in the model dir)"
        )
    return Response(state.manifest_p256_signature, media_type="text/plain")
