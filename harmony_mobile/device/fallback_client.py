"""The phone's side of the fallback server's API: enrolment, credentials, slot tables, error bodies.

Counterparts: harmony-core `org.harmonymobile.core.server` (HarmonyServerClient, DeviceCredentials,
Enrollment, SlotTable, ServerException); HarmonyKit `Net/HarmonyHTTPClient.swift`. The requests
themselves (infer, slot table of a version, upload) are made by `harmony_mobile.device.phone.Phone`.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import httpx

from harmony_mobile.device.errors import DeviceError
from harmony_mobile.protocol.label_tokens import parse_slot_table as protocol_parse_slot_table

MODEL_NAME = "harmony-backend"


@dataclass(frozen=True)
class DeviceCredentials:
    """What enrolment returns (PROTOCOL.md 2): keep the token secret, pin the server key."""

    device_id: str
    token: str = field(repr=False)
    server_public_key: bytes
    limits: dict

    @classmethod
    def from_enrolment(cls, response: dict) -> DeviceCredentials:
        return cls(
            device_id=response["device_id"],
            token=response["token"],
            server_public_key=base64.b64decode(response["server_public_key"]),
            limits=dict(response.get("limits") or {}),
        )


def enrol(base_url: str, admin_token: str, tier: str, name: str | None = None, timeout: float = 10.0) -> dict:
    """Provisioning step (operator side, admin token): POST /v1/devices; returns the enrolment JSON."""
    try:
        response = httpx.post(
            f"{base_url}/v1/devices",
            json={"tier": tier, **({"name": name} if name else {})},
            headers={"Authorization": f"Bearer {admin_token}"},
            timeout=timeout,
        )
    except (httpx.HTTPError, httpx.InvalidURL) as error:
        raise DeviceError(f"enrolment failed: cannot reach {base_url}: {error}") from None
    if response.status_code != 201:
        raise DeviceError(f"enrolment failed: {response.status_code} {response.text}")
    return response.json()


def parse_slot_table(slot_table: list[str]) -> list[bytes]:
    """Slot tokens from their serialized form (protocol.label_tokens.parse_slot_table), refused
    with the device runtime's own error."""
    if not isinstance(slot_table, list):
        raise DeviceError(f"a slot table is a list of hex tokens, got {type(slot_table).__name__}")
    try:
        return protocol_parse_slot_table(slot_table)
    except ValueError as error:
        raise DeviceError(f"slot_table: {error}") from None


def error_detail(response: httpx.Response) -> str:
    """The error sentence: a string `error` (/v2 routes, Open Inference Protocol), else a string
    `detail` (/v1 routes), else the body itself (a proxy's page; tests/vectors/error_bodies.json)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    for key in ("error", "detail"):
        if isinstance(body, dict) and isinstance(body.get(key), str):
            return body[key]
    return response.text[:200]
