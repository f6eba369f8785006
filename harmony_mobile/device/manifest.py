"""Trusting an export: the manifest's signature under the pinned key, its tiers, artifacts and normalization.

Counterparts: harmony-core `org.harmonymobile.core.manifest` (ManifestVerifier, Manifest, TierEntry,
Artifact, Normalization); HarmonyKit `Manifest/` (ManifestVerifier.swift, Manifest.swift).
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from harmony_mobile.device.errors import DeviceError
from harmony_mobile.privacy.options import UploadPrivacy
from harmony_mobile.protocol.public_keys import decode_ed25519_public_key
from harmony_mobile.protocol.wire import decode_tensor

MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
PUBLIC_KEY_FILE = "signing_key.pub"
EXIT_RULES = (
    "max_softmax",
    "slot_margin",
)  # the exit scores this runtime computes (docs/PROTOCOL.md 3.4-3.5)


def decode_public_key(text: str | bytes) -> Ed25519PublicKey:
    """A pinned signing key: base64 of the raw 32-byte Ed25519 key (the signing_key.pub format)."""
    try:
        return decode_ed25519_public_key(text)
    except ValueError as error:
        raise DeviceError(f"pinned Ed25519 key: {error}") from None


def verify_manifest_bytes(manifest: bytes, signature_b64: str | bytes, pinned_key: Ed25519PublicKey) -> dict:
    """Verify the signature over the exact manifest bytes with the pinned key, then parse them."""
    try:
        signature = base64.b64decode(signature_b64.strip(), validate=True)
        pinned_key.verify(signature, manifest)
    except (InvalidSignature, ValueError) as error:
        raise DeviceError(
            f"manifest signature does not verify with the pinned key ({error or 'invalid'})"
        ) from None
    return json.loads(manifest.decode("utf-8"))


def load_manifest(export_dir: str | Path, pinned_key: Ed25519PublicKey | str | bytes) -> dict:
    """manifest.json of an export directory, trusted only after its signature verified."""
    export_dir = Path(export_dir)
    if not isinstance(pinned_key, Ed25519PublicKey):
        pinned_key = decode_public_key(pinned_key)
    try:
        manifest = (export_dir / MANIFEST_FILE).read_bytes()
        signature = (export_dir / SIGNATURE_FILE).read_bytes()
    except OSError as error:
        raise DeviceError(f"cannot read the signed manifest in {export_dir}: {error}") from None
    return verify_manifest_bytes(manifest, signature, pinned_key)


class RollbackError(DeviceError):
    """A signed manifest older than the installed one (or as old, with other content): refused."""


def manifest_version(manifest: dict) -> int:
    """The monotonic manifest_version (0 for manifests written before it existed)."""
    version = manifest.get("manifest_version", 0)
    if type(version) is not int or version < 0:
        raise DeviceError(f"manifest_version must be a non-negative integer, got {version!r}")
    return version


def is_update(installed: tuple[int, str] | None, candidate: dict, candidate_bytes: bytes) -> bool:
    """Whether a verified candidate manifest should replace the installed one, given as
    (manifest_version, sha256 of its bytes): True when newer, False when it is the very same
    manifest; RollbackError when older, or as old with different bytes (a version is never reused)."""
    version = manifest_version(candidate)
    if installed is None:
        return True
    installed_version, installed_sha256 = installed
    if version > installed_version:
        return True
    if version == installed_version and hashlib.sha256(candidate_bytes).hexdigest() == installed_sha256:
        return False
    what = "older than" if version < installed_version else "as old as, but different from,"
    raise RollbackError(
        f"refusing manifest_version {version} ({candidate.get('model_version')}): it is {what} the installed "
        f"manifest_version {installed_version}"
    )


# The order variants are preferred in: a passing one first, then one nothing checked (Core ML parity
# runs on a Mac), a failed one only when nothing else is there.
VERDICT_ORDER = ("pass", "not_checked", "fail")
PTE_PREFERENCE = ("int8", "fp32")  # smaller and faster first


def choose_artifact(
    entry: dict, backend: str = "xnnpack", preference: tuple[str, ...] = PTE_PREFERENCE
) -> dict:
    """The tier's artifact for `backend`: the best verdict first (VERDICT_ORDER), then the preferred
    quantization; counterparts: harmony-core VariantChooser, HarmonyKit VariantChooser."""
    candidates = [a for a in entry["artifacts"] if a["backend"] == backend]
    if not candidates:
        raise DeviceError(f"tier {entry['name']} has no {backend} artifact")

    def rank(artifact: dict) -> tuple[int, int]:
        verdict = artifact.get("verdict", "not_checked")
        quantization = artifact["quantization"]
        return (
            VERDICT_ORDER.index(verdict) if verdict in VERDICT_ORDER else len(VERDICT_ORDER),
            preference.index(quantization) if quantization in preference else len(preference),
        )

    return min(candidates, key=rank)


def find_tier_entry(manifest: dict, tier: str) -> dict:
    for entry in manifest["tiers"]:
        if entry["name"] == tier:
            return entry
    raise DeviceError(
        f"the manifest has no tier {tier!r}; it has {', '.join(t['name'] for t in manifest['tiers'])}"
    )


def pte_artifact(entry: dict, quantization: str) -> dict:
    for artifact in entry["artifacts"]:
        if artifact["format"] == "pte" and artifact["quantization"] == quantization:
            return artifact
    raise DeviceError(f"tier {entry['name']} has no {quantization} .pte artifact")


def read_verified_artifact(export_dir: str | Path, artifact: dict) -> bytes:
    """An artifact's bytes after checking their sha256 and size against the (verified) manifest."""
    path = Path(export_dir) / artifact["path"]
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DeviceError(f"cannot read {artifact['path']}: {error}") from None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != artifact["size"] or digest != artifact["sha256"]:
        raise DeviceError(
            f"{artifact['path']} does not match the signed manifest "
            f"(sha256 {digest[:12]}…, {len(data)} bytes; manifest {artifact['sha256'][:12]}…, {artifact['size']} bytes)"
        )
    return data


def tier_exit_rule(entry: dict) -> str:
    """The score a tier's threshold is on (absent: max softmax); a rule this runtime does not
    compute is refused, never misread."""
    rule = entry.get("exit_rule", "max_softmax")
    if rule not in EXIT_RULES:
        raise DeviceError(
            f"tier {entry['name']} exits by {rule!r}; this runtime answers by {' or '.join(EXIT_RULES)}"
        )
    return rule


def phone_files(manifest: dict, tier: str) -> list[dict]:
    """The files a phone of `tier` installs: its front-end artifact, and the slot prototypes when
    the tier exits by slot_margin (each a manifest entry with `path`, `sha256`, `size`)."""
    entry = find_tier_entry(manifest, tier)
    rule = tier_exit_rule(entry)
    files = [choose_artifact(entry)]
    if rule == "slot_margin":
        if not manifest.get("slot_prototypes"):
            raise DeviceError(f"tier {tier} exits by slot_margin but the manifest has no slot_prototypes")
        files.append(manifest["slot_prototypes"])
    return files


def load_slot_prototypes(export_dir: str | Path, manifest: dict) -> torch.Tensor | None:
    """The server's slot prototypes a slot_margin tier gates by (docs/PROTOCOL.md 3.5), checked
    against the signed manifest; None when the manifest ships none."""
    entry = manifest.get("slot_prototypes")
    if entry is None:
        return None
    try:
        prototypes = decode_tensor(read_verified_artifact(export_dir, entry))
    except ValueError as error:
        raise DeviceError(f"{entry['path']}: {error}") from None
    expected = [len(manifest["slot_table"]), int(np.prod(manifest["interface_shape"]))]
    if list(prototypes.shape) != list(entry["shape"]) or list(entry["shape"]) != expected:
        raise DeviceError(
            f"{entry['path']} holds {list(prototypes.shape)}, the manifest says {entry['shape']}; "
            f"{len(manifest['slot_table'])} slots of {expected[1]} features need {expected}"
        )
    if not np.isfinite(prototypes).all():
        raise DeviceError(f"{entry['path']} holds non-finite values")
    return torch.from_numpy(prototypes.copy())


def normalize(pixels: np.ndarray | torch.Tensor, normalization: dict) -> torch.Tensor:
    """Pixels (C, H, W) or (N, C, H, W), 0..255 -> float32 NCHW, (pixel * scale - mean[c]) / std[c]."""
    x = torch.as_tensor(np.asarray(pixels), dtype=torch.float32)
    if x.dim() == 3:
        x = x.unsqueeze(0)
    mean = torch.tensor(normalization["mean"], dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(normalization["std"], dtype=torch.float32).view(1, -1, 1, 1)
    return ((x * normalization.get("pixel_scale", 1 / 255) - mean) / std).contiguous()


def upload_privacy(manifest: dict) -> UploadPrivacy:
    """The upload protections the lineage trained with (the manifest's `run` object says which)."""
    run = manifest.get("run", {})
    return UploadPrivacy(
        label_dp_epsilon=run.get("label_dp_epsilon"),
        feature_clip=run.get("feature_clip"),
        noise_multiplier=run.get("noise_multiplier"),
    )
