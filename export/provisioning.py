"""The provisioning payload: how a phone gets the federation secret (and its device credentials) at
run time, instead of finding it inside the app.

The secret decodes every phone's label tokens, so it never ships in an APK or .app (`harmony
export-app` writes none): an operator makes a payload with `harmony provision`, and the phone takes
it through one explicit step, stores it in the Android Keystore / iOS Keychain and refuses to
tokenize or decode without it. docs/PROVISIONING.md describes the steps; the format is:

    harmony-mobile://provision/v1#<base64url, no padding, of the UTF-8 JSON document>

as a deep link (or a QR code of it, which the phone's camera app opens), or the bare JSON document
as the value `provisioning_payload` of Android managed configuration / iOS managed app config.
The JSON document (compact, keys in this order):

    kind                "harmony-mobile/provisioning"
    format              1
    federation_secret   base64 (standard alphabet, padded) of 16..1024 raw bytes
    server_url          optional: http(s) URL of the fallback server
    device              optional: {"device_id", "token", "server_public_key" (base64 of 32 bytes)},
                        an enrolment the operator made for this phone (POST /v1/devices)
    own_classes         optional: {tier name: [class name, ...]}, the classes the phone holds when
                        it runs that tier's front-end: what a slot_margin tier gates by (docs/PROTOCOL.md
                        3.5). A phone trained on its own data knows them; a demo app that installs a
                        front-end personalized elsewhere learns them here, from the owner, never from
                        the operator's manifest

Readers refuse unknown keys, another kind or format, a secret outside 16..1024 bytes, the public
placeholder secret the demo apps once bundled, and own_classes that is not 1..64 tiers (names of
1..64 characters) each with 1..1000 distinct class names of 1..128 characters. Parsers: harmony-core
`org.harmonymobile.core.provisioning.ProvisioningPayload`, HarmonyKit `Provisioning/ProvisioningPayload.swift`.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the run dir pulls in torch; a payload is read without it
    from harmony_mobile.export.manifest import Manifest

    from harmony_mobile.run_dir import RunDir

PAYLOAD_KIND = "harmony-mobile/provisioning"
PAYLOAD_FORMAT = 1
URI_PREFIX = "harmony-mobile://provision/v1#"
MANAGED_CONFIG_KEY = "provisioning_payload"
MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 1024
MAX_DEVICE_ID_CHARS = 128
MAX_TOKEN_CHARS = 512
SERVER_KEY_BYTES = 32
MAX_OWN_CLASS_TIERS = 64
MAX_TIER_NAME_CHARS = 64
MAX_OWN_CLASSES = 1000
MAX_CLASS_NAME_CHARS = 128
# The secret the demo apps bundled as a placeholder (public, in git history): never a real one.
PLACEHOLDER_SECRET = b"harmony demo federation secret!!!"
_URL = re.compile(r"https?://[^\s\"'\\<>]+")


class ProvisioningError(ValueError):
    """A provisioning payload is malformed or would bundle / expose a secret; says what is wrong."""


@dataclass(frozen=True)
class ProvisionedDevice:
    device_id: str
    token: str = field(repr=False)
    server_public_key: bytes


@dataclass(frozen=True)
class Provisioning:
    federation_secret: bytes = field(repr=False)
    server_url: str | None = None
    device: ProvisionedDevice | None = None
    own_classes: dict[str, tuple[str, ...]] | None = None  # tier name -> the classes its phone holds

    def __post_init__(self) -> None:
        check_secret(self.federation_secret)
        if self.server_url is not None and not _URL.fullmatch(self.server_url):
            raise ProvisioningError(f"server_url must be an http(s) URL, got {self.server_url!r}")
        if self.device is not None:
            _check_device(self.device)
        if self.own_classes is not None:
            _check_own_classes(self.own_classes)


def check_secret(secret: bytes) -> bytes:
    if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
        raise ProvisioningError(
            f"a federation secret has {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes, this one {len(secret)}"
        )
    if secret == PLACEHOLDER_SECRET:
        raise ProvisioningError("this is the public placeholder secret, not a federation's secret")
    return secret


def _check_device(device: ProvisionedDevice) -> None:
    if not 0 < len(device.device_id) <= MAX_DEVICE_ID_CHARS:
        raise ProvisioningError(f"device.device_id must have 1..{MAX_DEVICE_ID_CHARS} characters")
    if not 0 < len(device.token) <= MAX_TOKEN_CHARS:
        raise ProvisioningError(f"device.token must have 1..{MAX_TOKEN_CHARS} characters")
    if len(device.server_public_key) != SERVER_KEY_BYTES:
        raise ProvisioningError(f"device.server_public_key must hold {SERVER_KEY_BYTES} bytes")


def _check_own_classes(own_classes: dict) -> None:
    if not isinstance(own_classes, dict) or not 0 < len(own_classes) <= MAX_OWN_CLASS_TIERS:
        raise ProvisioningError(f"own_classes must map 1..{MAX_OWN_CLASS_TIERS} tier names to class names")
    for tier, classes in own_classes.items():
        if not isinstance(tier, str) or not 0 < len(tier) <= MAX_TIER_NAME_CHARS:
            raise ProvisioningError(f"own_classes: a tier name has 1..{MAX_TIER_NAME_CHARS} characters")
        if not isinstance(classes, tuple) or not 0 < len(classes) <= MAX_OWN_CLASSES:
            raise ProvisioningError(f"own_classes[{tier!r}] must list 1..{MAX_OWN_CLASSES} class names")
        if not all(isinstance(c, str) and 0 < len(c) <= MAX_CLASS_NAME_CHARS for c in classes):
            raise ProvisioningError(
                f"own_classes[{tier!r}]: a class name is a string of 1..{MAX_CLASS_NAME_CHARS} characters"
            )
        if len(set(classes)) != len(classes):
            raise ProvisioningError(f"own_classes[{tier!r}] names a class twice")


def provisioned_device(enrolment: dict) -> ProvisionedDevice:
    """The device part of a payload from an enrolment response (POST /v1/devices)."""
    try:
        key = base64.b64decode(enrolment["server_public_key"], validate=True)
        return ProvisionedDevice(enrolment["device_id"], enrolment["token"], key)
    except (KeyError, TypeError, binascii.Error, ValueError) as error:
        raise ProvisioningError(f"not an enrolment response: {error}") from None


def payload_document(provisioning: Provisioning) -> dict:
    """The JSON document, keys in the documented order."""
    document: dict = {
        "kind": PAYLOAD_KIND,
        "format": PAYLOAD_FORMAT,
        "federation_secret": base64.b64encode(provisioning.federation_secret).decode("ascii"),
    }
    if provisioning.server_url is not None:
        document["server_url"] = provisioning.server_url
    if provisioning.device is not None:
        document["device"] = {
            "device_id": provisioning.device.device_id,
            "token": provisioning.device.token,
            "server_public_key": base64.b64encode(provisioning.device.server_public_key).decode("ascii"),
        }
    if provisioning.own_classes is not None:
        document["own_classes"] = {tier: list(classes) for tier, classes in provisioning.own_classes.items()}
    return document


def payload_json(provisioning: Provisioning) -> str:
    """The compact JSON document (the managed-configuration value)."""
    return json.dumps(payload_document(provisioning), separators=(",", ":"), ensure_ascii=False)


def payload_uri(provisioning: Provisioning) -> str:
    """The deep link / QR code text."""
    encoded = base64.urlsafe_b64encode(payload_json(provisioning).encode("utf-8")).rstrip(b"=")
    return URI_PREFIX + encoded.decode("ascii")


def parse_payload(text: str) -> Provisioning:
    """A deep link or a bare JSON document, validated as every reader does."""
    text = text.strip()
    if text.startswith(URI_PREFIX):
        encoded = text[len(URI_PREFIX) :]
        try:
            text = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError) as error:
            raise ProvisioningError(f"the link's payload is not base64url of UTF-8 JSON: {error}") from None
    elif not text.startswith("{"):
        raise ProvisioningError(f"a provisioning payload starts with {URI_PREFIX} or is a JSON object")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ProvisioningError(f"the payload is not JSON: {error}") from None
    return _from_document(document)


def _from_document(document: object) -> Provisioning:
    if not isinstance(document, dict):
        raise ProvisioningError("the payload is not a JSON object")
    unknown = set(document) - {"kind", "format", "federation_secret", "server_url", "device", "own_classes"}
    if unknown:
        raise ProvisioningError(f"unknown payload keys: {', '.join(sorted(unknown))}")
    if document.get("kind") != PAYLOAD_KIND:
        raise ProvisioningError(f"kind must be {PAYLOAD_KIND!r}")
    if type(document.get("format")) is not int or document["format"] != PAYLOAD_FORMAT:
        raise ProvisioningError(f"payload format {document.get('format')!r} is not supported (1 is)")
    device = document.get("device")
    if device is not None:
        if not isinstance(device, dict) or set(device) != {"device_id", "token", "server_public_key"}:
            raise ProvisioningError("device must hold exactly device_id, token and server_public_key")
        device = ProvisionedDevice(
            _string(device["device_id"], "device.device_id"),
            _string(device["token"], "device.token"),
            _base64(device["server_public_key"], "device.server_public_key"),
        )
    server_url = document.get("server_url")
    return Provisioning(
        _base64(document.get("federation_secret"), "federation_secret"),
        None if server_url is None else _string(server_url, "server_url"),
        device,
        _own_classes(document.get("own_classes")),
    )


def _own_classes(value: object) -> dict[str, tuple[str, ...]] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProvisioningError("own_classes must be a JSON object of tier name -> class names")
    if not all(isinstance(classes, list) for classes in value.values()):
        raise ProvisioningError("own_classes: each tier's classes are a JSON array")
    return {tier: tuple(classes) for tier, classes in value.items()}  # checked by Provisioning


def _string(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ProvisioningError(f"{name} must be a string")
    return value


def _base64(value: object, name: str) -> bytes:
    if not isinstance(value, str):
        raise ProvisioningError(f"{name} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ProvisioningError(f"{name} is not base64: {error}") from None


def own_classes_of_export(run: RunDir, manifest: Manifest, export_dir: Path) -> dict[str, tuple[str, ...]]:
    """For each tier an export ships, the classes of the client whose front-end it is: the owner's
    run knows them (its client part); the manifest, which the operator serves, names only the client.
    `manifest`: the export's, already verified (manifest.verify_manifest)."""
    if list(manifest.class_names) != list(run.info.class_names):
        raise ProvisioningError(f"{export_dir} was not exported from {run.path}: its class names differ")
    clients = {client.client_id: client for client in run.clients()}
    own = {}
    for entry in manifest.tiers:
        client = clients.get(entry.client_id)
        if client is None or client.tier != entry.name:
            raise ProvisioningError(
                f"{export_dir} ships client {entry.client_id} for tier {entry.name!r}, which {run.path} does not hold"
            )
        own[entry.name] = tuple(run.info.class_names[c] for c in client.classes)
    return own


def _app_trees_above(path: Path) -> list[Path]:
    """The demo apps' folders of any checkout `path` lies in, wherever the command runs from."""
    for parent in path.resolve().parents:
        if (parent / "android_demo").is_dir() and (parent / "ios_demo").is_dir():
            return [parent / "android_demo", parent / "ios_demo"]
    return []


def write_payload(path: Path, text: str, app_roots: list[Path]) -> Path:
    """Write the payload owner-only (0600 from the first byte) to `path`, which must lie outside the
    apps' trees: a payload there would be packaged into the app."""
    path = Path(path).expanduser().absolute()
    for root in [*app_roots, *_app_trees_above(path)]:
        if path.resolve().is_relative_to(Path(root).resolve()):
            raise ProvisioningError(
                f"{path} is inside {root}: a payload there would ship in the app; write it elsewhere"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # an existing file may have been created with wider permissions
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    return path
