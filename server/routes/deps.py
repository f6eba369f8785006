"""The FastAPI dependencies of the endpoints: the per-app state (server/services/state.py) and its
parts, and bearer-token auth (devices and the admin) with the per-device rate limit."""

from __future__ import annotations

import hmac
import math
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from harmony_mobile.server.core.records import DeviceRecord
from harmony_mobile.server.core.security import hash_token
from harmony_mobile.server.core.settings import Settings
from harmony_mobile.server.services.state import ServerState
from harmony_mobile.server.services.store import Store


async def get_state(request: Request) -> ServerState:
    # async: a plain `def` dependency would cost a thread-pool hop on every request
    return request.app.state.harmony


StateDep = Annotated[ServerState, Depends(get_state)]


async def get_settings(state: StateDep) -> Settings:
    return state.settings


async def get_store(state: StateDep) -> Store:
    return state.store


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]

bearer_scheme = HTTPBearer(auto_error=False, description="device token from enrolment, or the admin token")


@dataclass(frozen=True)
class Principal:
    role: Literal["device", "admin"]
    device_id: str | None = None
    tier: str | None = None  # the tier the device was enrolled with


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, message, headers={"WWW-Authenticate": "Bearer"})


async def _device(state, token: str) -> DeviceRecord | None:
    token_hash = hash_token(token)
    device = state.token_cache.get(token_hash)
    if device is None:
        # the store may wait on an upload's fsync: never on the event loop
        device = await run_in_threadpool(state.store.device_by_token_hash, token_hash)
        if device is not None:
            state.token_cache.put(token_hash, device)
    return device


async def authenticate(
    state: StateDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> Principal:
    token = credentials.credentials if credentials and credentials.scheme.lower() == "bearer" else None
    return await principal_for(state, token)


async def authenticate_header(state, authorization: str | None) -> Principal:
    """The same check from the raw header, for hot endpoints that skip dependency resolution."""
    scheme, _, token = (authorization or "").partition(" ")
    return await principal_for(state, token.strip() if scheme.lower() == "bearer" else None)


async def principal_for(state, token: str | None) -> Principal:
    if not token:
        raise _unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    if hmac.compare_digest(token.encode(), state.admin_token.encode()):
        return Principal("admin")
    device = await _device(state, token)
    if device is None:
        raise _unauthorized("unknown bearer token")
    if device.revoked_at is not None:
        raise _unauthorized(f"the token of device {device.id} was revoked at {device.revoked_at}")
    wait = state.rate_limiter.acquire(device.id)
    if wait > 0:
        state.metrics.rate_limited.inc()
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"device {device.id} exceeded {state.settings.rate_limit_per_second:g} requests/s",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )
    return Principal("device", device.id, device.tier)


PrincipalDep = Annotated[Principal, Depends(authenticate)]


async def require_admin(principal: PrincipalDep) -> Principal:
    if principal.role != "admin":
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this endpoint needs the admin token")
    return principal


async def require_device(principal: PrincipalDep) -> Principal:
    if principal.role != "device":
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, "this endpoint needs a device token (uploads belong to a device)"
        )
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]
DeviceDep = Annotated[Principal, Depends(require_device)]
AnyPrincipalDep = PrincipalDep
