"""Bearer-token auth (devices and the admin) and the per-device rate limit, as FastAPI dependencies."""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from harmony_mobile.server.state import StateDep
from harmony_mobile.server.store import DeviceRecord

bearer_scheme = HTTPBearer(auto_error=False, description="device token from enrolment, or the admin token")


@dataclass(frozen=True)
class Principal:
    role: Literal["device", "admin"]
    device_id: str | None = None
    tier: str | None = None  # the tier the device was enrolled with


def new_device_token() -> str:
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """Device tokens are 256-bit random strings, so a plain SHA-256 is enough (no password stretching)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, message, headers={"WWW-Authenticate": "Bearer"})


class RateLimiter:
    """A token bucket per device: `rate` requests per second sustained, `burst` at once."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def acquire(self, key: str) -> float:
        """0 if allowed, else the seconds until one request would be."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate


class TokenCache:
    """Device look-ups by token hash, reused for `ttl` seconds: most requests then skip the store and
    the thread-pool hop. Revocation in this process forgets the device at once; other replicas
    see it when their entry expires (README: replicas)."""

    def __init__(self, ttl: float):
        self.ttl = ttl
        self._entries: dict[str, tuple[DeviceRecord, float]] = {}

    def get(self, token_hash: str) -> DeviceRecord | None:
        entry = self._entries.get(token_hash)
        if entry is None or entry[1] < time.monotonic():
            return None
        return entry[0]

    def put(self, token_hash: str, device: DeviceRecord) -> None:
        if self.ttl > 0:
            if len(self._entries) > 100_000:  # bounded: drop everything rather than grow forever
                self._entries.clear()
            self._entries[token_hash] = (device, time.monotonic() + self.ttl)

    def forget_device(self, device_id: str) -> None:
        for token_hash in [h for h, (d, _) in self._entries.items() if d.id == device_id]:
            self._entries.pop(token_hash, None)


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
