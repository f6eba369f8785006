"""The export manifest: what a phone app reads, and its Ed25519 and ECDSA P-256 signatures.

Files in an export directory that carry the trust:

    manifest.json     UTF-8 JSON (schema: `Manifest` below). Apps parse it only after the
                      signature over its exact bytes has been verified.
    manifest.sig      base64 (standard alphabet, padded, no newline) of the 64-byte Ed25519
                      signature over the exact bytes of manifest.json, as read from disk
                      (no canonicalization, no re-serialization).
    signing_key.pub   base64 (no newline) of the raw 32-byte Ed25519 public key. Apps must pin
                      the key (compare against a key they ship), because whoever can replace
                      the manifest can also replace this file.
    manifest.p256.sig     base64 (no newline) of the DER ECDSA P-256 signature (SHA-256) over the
                          same exact bytes; RFC 6979 deterministic, so re-signing is reproducible.
    signing_key_p256.pub  base64 (no newline) of the P-256 key's X.509 SubjectPublicKeyInfo DER.

Both signatures cover the same bytes and both keys are named (by sha256) in the signed manifest,
so an app verifies whichever its platform supports against the key it pins: Android's JCA has
`SHA256withECDSA` on every API level but Ed25519 only on recent Conscrypt builds (export/keys.py).

Every other file in the directory is listed in `files` with its sha256 (lowercase hex) and size
in bytes; a file that is not listed is a verification error. A tier artifact that is a
directory (a Core ML `.mlpackage`) has `sha256` = the *tree digest*: sha256 of the lines
`"<sha256 hex>  <path relative to the package, '/' separated>\\n"` sorted by path, concatenated
(the output format of `sha256sum` run inside the package on the sorted file list), and `size` =
the sum of its files' sizes. Its files are also listed individually in `files`.

Verification order for apps: (1) verify manifest.sig over manifest.json bytes with the pinned
key; (2) parse manifest.json; (3) check sha256 and size of every file they load.

Updates: `manifest_version` is a monotonic integer (by default the export's creation time in UTC
seconds, and always above the version of the export it replaces). A phone installs a newer signed
manifest only when its version is higher than the one it runs, or equal with byte-identical
content; anything older is a rollback and refused (harmony_mobile/device/manifest.py, harmony-core
ManifestUpdate, HarmonyKit ManifestUpdate). Manifests written before the field existed read as 0.

Variant verdicts: each artifact's `verdict` says whether it met the export's quality checks
("pass", "fail", or "not_checked" where no check runs here, e.g. Core ML parity needs a Mac) and
`failed_checks` names the checks it missed. Apps prefer a passing variant.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from pathlib import Path, PurePosixPath
from typing import Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from harmony_mobile.export.keys import (
    P256_PUBLIC_KEY_FILE,
    PUBLIC_KEY_FILE,
    SigningKeyError,
    decode_p256_public_key,
    decode_public_key,
    encode_p256_public_key,
    encode_public_key,
    key_fingerprint,
    load_p256_public_key,
    load_public_key,
    p256_key_fingerprint,
    p256_public_key_der,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator

from harmony_mobile.protocol.digests import sha256_file
from harmony_mobile.protocol.label_tokens import LABEL_EPOCH_PATTERN
from harmony_mobile.protocol.public_keys import decode_base64_of_size

MANIFEST_FORMAT = 1
VERDICTS = ("pass", "not_checked", "fail")  # the order apps prefer variants in
MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
P256_SIGNATURE_FILE = "manifest.p256.sig"
SIGNATURE_FILES = (MANIFEST_FILE, SIGNATURE_FILE, PUBLIC_KEY_FILE, P256_SIGNATURE_FILE, P256_PUBLIC_KEY_FILE)
P256_ALGORITHM = ec.ECDSA(hashes.SHA256(), deterministic_signing=True)


class ManifestError(ValueError):
    """An export directory failed verification; `problems` lists every mismatch, each naming its file."""

    def __init__(self, directory: Path, problems: list[str]):
        self.directory = Path(directory)
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"export directory {self.directory} failed verification:\n{lines}")


# --------------------------------------------------------------------------- schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileEntry(_Strict):
    path: str = Field(description="relative to the export directory, '/' separated")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class TensorSpec(_Strict):
    name: str
    shape: list[int] = Field(description="at batch 1, batch first; each artifact states its batch range")
    dtype: str = "float32"


class Normalization(_Strict):
    """value = (pixel / 255 - mean[c]) / std[c], per channel c, in NCHW order."""

    pixel_scale: float = 1.0 / 255.0
    mean: list[float]
    std: list[float]


class Artifact(_Strict):
    backend: Literal["xnnpack", "coreml"]
    quantization: str
    format: Literal["pte", "mlpackage"]
    path: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="file sha256, or tree digest of a directory")
    size: int = Field(ge=0)
    batch: tuple[int, int] = Field(description="(min, max) batch the artifact accepts")
    parameters: int | None = None
    extra: dict[str, str | int | float | bool] = {}
    verdict: Literal["pass", "not_checked", "fail"] = Field(
        "not_checked", description="whether this variant met the export's quality checks"
    )
    failed_checks: list[str] = Field([], description="the checks this variant missed (verification.json)")


class ProgramFile(_Strict):
    path: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class SlotPrototypes(_Strict):
    """The server's slot prototypes (federation/slot_gate.py): one unit-norm row per slot, in slot
    order (an all-zero row: a slot without one), as one float32 HMFT tensor (docs/PROTOCOL.md 5)."""

    path: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    shape: tuple[int, int] = Field(description="(slots, flattened interface size)")


class Personalization(_Strict):
    """A tier's on-device training (export/personalization.py): the phone runs `frozen_program`
    (XNNPACK) once per own sample, trains the exit classifier through `training_program` (ExecuTorch
    TrainingModule + SGD, method `method`, batches of exactly `batch`, labels = exit positions), then
    answers with `frozen_program` + `head_program` fed its trained parameters and recalibrates its
    exit threshold on its own validation samples."""

    scope: Literal["exit_classifier"] = "exit_classifier"
    frozen_program: ProgramFile = Field(description="image -> (exit_hidden, features), XNNPACK fp32")
    training_program: ProgramFile = Field(
        description="(exit_hidden, exit_positions int64) -> (loss, exit_logits), forward-backward graph"
    )
    head_program: ProgramFile = Field(description="(exit_hidden, *parameters) -> exit_logits")
    method: str = "forward"
    batch: int = Field(ge=1, description="rows of every training step")
    hidden: int = Field(ge=1, description="exit_hidden width")
    parameter_names: list[str] = Field(description="trained parameters, in the head program's input order")
    parameter_shapes: list[list[int]]
    labels: Literal["exit_positions"] = "exit_positions"
    loss: Literal["cross_entropy"] = "cross_entropy"
    optimizer: Literal["sgd"] = "sgd"
    learning_rate: float = Field(gt=0)
    calibration_target: float | None = Field(
        None, description="local-exit accuracy the recalibrated threshold must reach on validation samples"
    )

    def programs(self) -> list[ProgramFile]:
        return [self.frozen_program, self.training_program, self.head_program]


class TierEntry(_Strict):
    name: str
    family: str
    split_depth: int
    width: float
    client_id: int = Field(description="the run's client whose personalized front-end this is")
    parameters: int
    input: TensorSpec
    normalization: Normalization
    outputs: list[TensorSpec]
    class_names: list[str]
    interface_shape: list[int]
    threshold: float = Field(description="answer locally when the exit rule's score >= threshold")
    threshold_source: Literal["calibrated", "tier"]
    exit_rule: Literal["max_softmax", "slot_margin"] = Field(
        "max_softmax",
        description="the score: max softmax(exit_logits) in (0, 1], or the slot margin in [-2, 2] "
        "(docs/PROTOCOL.md 3.5; the manifest's slot_prototypes); absent from the JSON when max_softmax",
    )
    quantization: list[str]
    backends: list[str]
    latency_budget_ms: float
    artifacts: list[Artifact]
    personalization: Personalization | None = Field(
        None, description="on-device training programs (absent from the JSON when the tier has none)"
    )

    @model_validator(mode="after")
    def _threshold_in_the_rules_range(self):
        low, high = (-2.0, 2.0 + 1e-6) if self.exit_rule == "slot_margin" else (0.0, 1.0 + 1e-6)
        if not (math.isfinite(self.threshold) and low <= self.threshold <= high):
            raise ValueError(f"tier {self.name}: a {self.exit_rule} threshold is in [{low:g}, {high:g}]")
        return self

    @model_serializer(mode="wrap")
    def _omit_defaults_of_older_manifests(self, handler):
        # absent, not null or default: manifests of exports without personalization and with the
        # max-softmax rule keep their exact bytes
        data = handler(self)
        if data.get("personalization") is None:
            data.pop("personalization", None)
        if data.get("exit_rule") == "max_softmax":
            data.pop("exit_rule", None)
        return data


class BackendEntry(_Strict):
    model_version: str
    interface_shape: list[int]
    num_classes: int
    input: TensorSpec
    outputs: list[TensorSpec]
    state_dict_file: str = Field(description="run_dir.save_backend format; the server loads this")
    exported_program_file: str = Field(description="torch.export .pt2 of g (features -> logits)")

    @classmethod
    def describe(
        cls,
        model_version: str,
        interface_shape: list[int],
        num_classes: int,
        state_dict_file: str = "backend/backend.pt",
        exported_program_file: str = "backend/backend.pt2",
    ) -> BackendEntry:
        """The entry of a back-end g: batch-1 `features` of the interface shape in, `logits` out."""
        return cls(
            model_version=model_version,
            interface_shape=list(interface_shape),
            num_classes=num_classes,
            input=TensorSpec(name="features", shape=[1, *interface_shape]),
            outputs=[TensorSpec(name="logits", shape=[1, num_classes])],
            state_dict_file=state_dict_file,
            exported_program_file=exported_program_file,
        )


class P256SignatureInfo(_Strict):
    algorithm: Literal["ECDSA-P256-SHA256"] = "ECDSA-P256-SHA256"
    signature_file: str = P256_SIGNATURE_FILE
    encoding: str = "base64 of the DER ECDSA signature over the exact bytes of manifest.json"
    public_key_file: str = P256_PUBLIC_KEY_FILE
    public_key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the SPKI DER")


class SignatureInfo(_Strict):
    algorithm: Literal["Ed25519"] = "Ed25519"
    signed_file: str = MANIFEST_FILE
    signature_file: str = SIGNATURE_FILE
    encoding: str = "base64 of the 64-byte signature over the exact bytes of manifest.json"
    public_key_file: str = PUBLIC_KEY_FILE
    public_key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    p256: P256SignatureInfo | None = None


class Manifest(_Strict):
    format: Literal[1] = MANIFEST_FORMAT
    kind: Literal["harmony-mobile/export"] = "harmony-mobile/export"
    model_version: str
    manifest_version: int = Field(
        0, ge=0, description="monotonic: a phone refuses a manifest older than the one it runs"
    )
    created_at: str
    run: dict[str, str | int | float | None]
    num_classes: int
    class_names: list[str]
    label_epoch: str = Field(pattern=LABEL_EPOCH_PATTERN, description="label epoch of the back-end's tokens")
    slot_table: list[str] = Field(
        description="slot i's label token (16 lowercase hex) of the shipped back-end"
    )
    interface_shape: list[int]
    backend: BackendEntry
    tiers: list[TierEntry]
    slot_prototypes: SlotPrototypes | None = Field(
        None, description="what slot_margin tiers gate by (absent from the JSON when no tier does)"
    )
    reports: list[str] = []
    signature: SignatureInfo
    files: list[FileEntry]

    @model_validator(mode="after")
    def _prototypes_for_slot_margin_tiers(self):
        gated = [t.name for t in self.tiers if t.exit_rule == "slot_margin"]
        if gated and self.slot_prototypes is None:
            raise ValueError(
                f"tiers {', '.join(gated)} exit by slot_margin: the manifest needs slot_prototypes"
            )
        expected = (len(self.slot_table), math.prod(self.interface_shape))
        if self.slot_prototypes is not None and self.slot_prototypes.shape != expected:
            raise ValueError(
                f"slot_prototypes has shape {list(self.slot_prototypes.shape)}: {len(self.slot_table)} "
                f"slots of the {expected[1]}-value interface need {list(expected)}"
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_absent_prototypes(self, handler):
        data = handler(self)
        if data.get("slot_prototypes") is None:
            data.pop("slot_prototypes", None)
        return data

    def tier(self, name: str) -> TierEntry:
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise KeyError(f"manifest has no tier {name!r}; it has {', '.join(t.name for t in self.tiers)}")


# --------------------------------------------------------------------------- hashing


def _relative(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def list_files(directory: str | Path, exclude: tuple[str, ...] = SIGNATURE_FILES) -> list[FileEntry]:
    """Every regular file below `directory` (sorted by path), except the top-level `exclude` names."""
    root = Path(directory)
    entries = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and _relative(root, path) not in exclude:
            entries.append(
                FileEntry(path=_relative(root, path), sha256=sha256_file(path), size=path.stat().st_size)
            )
    return sorted(entries, key=lambda e: e.path)


def tree_digest(entries: list[FileEntry]) -> tuple[str, int]:
    """(sha256, total size) of a directory from its file entries (paths relative to that directory)."""
    lines = "".join(f"{e.sha256}  {e.path}\n" for e in sorted(entries, key=lambda e: e.path))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest(), sum(e.size for e in entries)


def path_digest(path: str | Path) -> tuple[str, int]:
    """(sha256, size) of a file, or (tree digest, total size) of a directory such as an .mlpackage."""
    path = Path(path)
    if path.is_dir():
        return tree_digest(list_files(path, exclude=()))
    return sha256_file(path), path.stat().st_size


def artifact_entry(
    directory: str | Path,
    relpath: str,
    *,
    backend: str,
    quantization: str,
    batch: tuple[int, int] = (1, 1),
    parameters: int | None = None,
    extra: dict | None = None,
) -> Artifact:
    """An artifact entry for the file or .mlpackage directory at `directory/relpath` (digest computed here)."""
    sha, size = path_digest(Path(directory) / relpath)
    return Artifact(
        backend=backend,
        quantization=quantization,
        format="mlpackage" if relpath.endswith(".mlpackage") else "pte",
        path=relpath,
        sha256=sha,
        size=size,
        batch=batch,
        parameters=parameters,
        extra=extra or {},
    )


def build_manifest(
    directory: str | Path,
    *,
    model_version: str,
    run: dict,
    class_names: list[str] | tuple[str, ...],
    label_epoch: str,
    slot_table: list[str],
    interface_shape: list[int] | tuple[int, ...],
    backend: BackendEntry,
    tiers: list[TierEntry],
    public_key: Ed25519PublicKey,
    reports: list[str] | None = None,
    created_at: str | None = None,
    p256_public_key: ec.EllipticCurvePublicKey | None = None,
    manifest_version: int | None = None,
    slot_prototypes: SlotPrototypes | None = None,
) -> Manifest:
    """The manifest of everything currently in `directory` (call it after every artifact is written).

    `manifest_version` defaults to `created_at` in UTC seconds since the epoch."""
    from datetime import UTC, datetime

    if created_at is None:
        created_at = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    if manifest_version is None:
        manifest_version = int(datetime.fromisoformat(created_at.replace("Z", "+00:00")).timestamp())
    return Manifest(
        model_version=model_version,
        manifest_version=manifest_version,
        created_at=created_at,
        run=run,
        num_classes=len(class_names),
        class_names=list(class_names),
        label_epoch=label_epoch,
        slot_table=list(slot_table),
        interface_shape=list(interface_shape),
        backend=backend,
        tiers=tiers,
        slot_prototypes=slot_prototypes,
        reports=list(reports or []),
        signature=signature_info(public_key, p256_public_key),
        files=list_files(directory),
    )


# --------------------------------------------------------------------------- signing


def manifest_to_bytes(manifest: Manifest) -> bytes:
    """The bytes written to manifest.json (and signed): indented JSON, UTF-8, trailing newline."""
    return (json.dumps(manifest.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def sign_manifest(manifest_bytes: bytes, private_key: Ed25519PrivateKey) -> bytes:
    """The raw 64-byte Ed25519 signature over `manifest_bytes` (manifest.sig holds its base64)."""
    return private_key.sign(manifest_bytes)


def encode_signature(signature: bytes) -> bytes:
    """The exact content of manifest.sig."""
    if len(signature) != 64:
        raise ValueError(f"an Ed25519 signature has 64 bytes, got {len(signature)}")
    return base64.b64encode(signature)


def decode_signature(text: bytes) -> bytes:
    """The content of manifest.sig: base64 of a 64-byte Ed25519 signature."""
    return decode_base64_of_size(text, 64)


def sign_manifest_p256(manifest_bytes: bytes, private_key: ec.EllipticCurvePrivateKey) -> bytes:
    """The DER ECDSA P-256 / SHA-256 signature (RFC 6979 deterministic) over `manifest_bytes`."""
    return private_key.sign(manifest_bytes, P256_ALGORITHM)


def signature_info(
    public_key: Ed25519PublicKey, p256_public_key: ec.EllipticCurvePublicKey | None = None
) -> SignatureInfo:
    p256 = None
    if p256_public_key is not None:
        p256 = P256SignatureInfo(public_key_sha256=p256_key_fingerprint(p256_public_key))
    return SignatureInfo(public_key_sha256=key_fingerprint(public_key), p256=p256)


def write_signed_manifest(
    directory: str | Path,
    manifest: Manifest,
    private_key: Ed25519PrivateKey,
    p256_private_key: ec.EllipticCurvePrivateKey | None = None,
) -> bytes:
    """Write manifest.json, manifest.sig and signing_key.pub (and, when the manifest names a P-256
    key, manifest.p256.sig and signing_key_p256.pub) into `directory`; returns the manifest bytes."""
    directory = Path(directory)
    public_key = private_key.public_key()
    if manifest.signature.public_key_sha256 != key_fingerprint(public_key):
        raise ValueError("manifest.signature.public_key_sha256 does not match the signing key")
    p256 = manifest.signature.p256
    if (p256 is None) != (p256_private_key is None):
        raise ValueError("pass a P-256 private key exactly when the manifest names a P-256 key")
    if p256 is not None and p256.public_key_sha256 != p256_key_fingerprint(p256_private_key.public_key()):
        raise ValueError("manifest.signature.p256.public_key_sha256 does not match the P-256 signing key")
    data = manifest_to_bytes(manifest)
    (directory / MANIFEST_FILE).write_bytes(data)
    (directory / SIGNATURE_FILE).write_bytes(encode_signature(sign_manifest(data, private_key)))
    (directory / PUBLIC_KEY_FILE).write_bytes(encode_public_key(public_key))
    if p256_private_key is not None:
        signature = sign_manifest_p256(data, p256_private_key)
        (directory / P256_SIGNATURE_FILE).write_bytes(base64.b64encode(signature))
        (directory / P256_PUBLIC_KEY_FILE).write_bytes(encode_p256_public_key(p256_private_key.public_key()))
    return data


# --------------------------------------------------------------------------- verification


def _coerce_public_key(public_key: Ed25519PublicKey | bytes | str | Path) -> Ed25519PublicKey:
    if isinstance(public_key, Ed25519PublicKey):
        return public_key
    if isinstance(public_key, Path):
        return load_public_key(public_key)
    if isinstance(public_key, bytes) and len(public_key) == 32:
        return Ed25519PublicKey.from_public_bytes(public_key)
    return decode_public_key(public_key)


def _safe_relpath(path: str) -> bool:
    pure = PurePosixPath(path)
    return bool(path) and not pure.is_absolute() and ".." not in pure.parts and "\\" not in path


def _coerce_p256_key(public_key: ec.EllipticCurvePublicKey | bytes | str | Path) -> ec.EllipticCurvePublicKey:
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        return public_key
    if isinstance(public_key, Path):
        return load_p256_public_key(public_key)
    if isinstance(public_key, bytes) and public_key[:1] == b"\x30":  # raw SPKI DER
        return decode_p256_public_key(base64.b64encode(public_key))
    return decode_p256_public_key(public_key)


def _p256_problems(
    directory: Path,
    manifest: Manifest,
    data: bytes,
    pinned: ec.EllipticCurvePublicKey | bytes | str | Path | None,
) -> list[str]:
    """The P-256 signature's problems: checked when the manifest names a P-256 key or one is pinned."""
    info = manifest.signature.p256
    if info is None:
        return (
            [f"{MANIFEST_FILE}: names no P-256 key, but a P-256 key is pinned"] if pinned is not None else []
        )
    shipped_path, signature_path = directory / P256_PUBLIC_KEY_FILE, directory / P256_SIGNATURE_FILE
    problems = []
    try:
        key = _coerce_p256_key(pinned) if pinned is not None else load_p256_public_key(shipped_path)
        if pinned is not None and shipped_path.is_file():
            if p256_public_key_der(load_p256_public_key(shipped_path)) != p256_public_key_der(key):
                problems.append(f"{P256_PUBLIC_KEY_FILE}: is not the pinned P-256 public key")
    except SigningKeyError as error:
        return [f"{P256_PUBLIC_KEY_FILE}: {error}"]
    if info.public_key_sha256 != p256_key_fingerprint(key):
        problems.append(f"{MANIFEST_FILE}: signature.p256.public_key_sha256 names another key")
    if not signature_path.is_file():
        return [*problems, f"{P256_SIGNATURE_FILE}: missing"]
    try:
        signature = base64.b64decode(signature_path.read_bytes().strip(), validate=True)
        key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except ValueError as error:
        problems.append(f"{P256_SIGNATURE_FILE}: not base64: {error}")
    except InvalidSignature:
        problems.append(
            f"{P256_SIGNATURE_FILE}: signature does not match {MANIFEST_FILE} under the P-256 key"
        )
    return problems


def _pinned_key(
    directory: Path, public_key: Ed25519PublicKey | bytes | str | Path | None
) -> tuple[Ed25519PublicKey | None, list[str]]:
    """The Ed25519 key to verify with (the pinned one, else the shipped signing_key.pub), and the
    problems that stop verification before anything is read: missing manifest/signature, bad key."""
    problems = [
        f"{name}: missing" for name in (MANIFEST_FILE, SIGNATURE_FILE) if not (directory / name).is_file()
    ]
    try:
        key = (
            _coerce_public_key(public_key)
            if public_key is not None
            else load_public_key(directory / PUBLIC_KEY_FILE)
        )
    except (SigningKeyError, ValueError) as error:
        problems.append(f"{PUBLIC_KEY_FILE}: {error}")
        key = None
    return key, problems


def _shipped_key_problems(directory: Path, key: Ed25519PublicKey) -> list[str]:
    """A shipped signing_key.pub next to a pinned key must be that key."""
    if not (directory / PUBLIC_KEY_FILE).is_file():
        return []
    try:
        shipped = load_public_key(directory / PUBLIC_KEY_FILE)
    except SigningKeyError as error:
        return [f"{PUBLIC_KEY_FILE}: {error}"]
    return [f"{PUBLIC_KEY_FILE}: is not the pinned public key"] if shipped != key else []


def _ed25519_problems(directory: Path, key: Ed25519PublicKey, data: bytes) -> list[str]:
    """manifest.sig must be a valid Ed25519 signature over the exact manifest bytes."""
    try:
        key.verify(decode_signature((directory / SIGNATURE_FILE).read_bytes()), data)
    except ValueError as error:
        return [f"{SIGNATURE_FILE}: {error}"]
    except InvalidSignature:
        return [f"{SIGNATURE_FILE}: signature does not match {MANIFEST_FILE} under the public key"]
    return []


def _listed_file_problems(directory: Path, manifest: Manifest) -> tuple[dict[str, FileEntry], list[str]]:
    """The safely-pathed entries of `files` by path, and every listed file that is missing or whose
    size or sha256 differs."""
    listed: dict[str, FileEntry] = {}
    problems = []
    for entry in manifest.files:
        if not _safe_relpath(entry.path):
            problems.append(f"{entry.path}: unsafe path in manifest")
            continue
        listed[entry.path] = entry
        path = directory / entry.path
        if not path.is_file():
            problems.append(f"{entry.path}: missing")
            continue
        size = path.stat().st_size
        if size != entry.size:
            problems.append(f"{entry.path}: size {size} bytes, manifest says {entry.size}")
        digest = sha256_file(path)
        if digest != entry.sha256:
            problems.append(f"{entry.path}: sha256 {digest} does not match manifest {entry.sha256}")
    return listed, problems


def _unlisted_file_problems(directory: Path, listed: dict[str, FileEntry]) -> list[str]:
    return [
        f"{entry.path}: present but not listed in {MANIFEST_FILE}"
        for entry in list_files(directory)
        if entry.path not in listed
    ]


def _referenced_file_problems(directory: Path, manifest: Manifest, listed: dict[str, FileEntry]) -> list[str]:
    """Every path a tier artifact, the back-end or the reports name must exist and be listed; a tier
    artifact's digest and size (a tree digest for an .mlpackage) must match its entry."""
    referenced = [(f"tier {t.name}", a.path, a.sha256, a.size) for t in manifest.tiers for a in t.artifacts]
    referenced += [
        (f"tier {t.name} personalization", p.path, p.sha256, p.size)
        for t in manifest.tiers
        if t.personalization is not None
        for p in t.personalization.programs()
    ]
    referenced += [("backend", manifest.backend.state_dict_file, None, None)]
    referenced += [("backend", manifest.backend.exported_program_file, None, None)]
    referenced += [("reports", r, None, None) for r in manifest.reports]
    problems = []
    for owner, relpath, sha, size in referenced:
        if not _safe_relpath(relpath):
            problems.append(f"{relpath}: unsafe path in manifest ({owner})")
            continue
        path = directory / relpath
        if not path.exists():
            problems.append(f"{relpath}: missing ({owner})")
            continue
        if path.is_file() and relpath not in listed:
            problems.append(f"{relpath}: referenced by {owner} but not listed in files")
        if sha is not None:
            actual_sha, actual_size = path_digest(path)
            if (actual_sha, actual_size) != (sha, size):
                problems.append(
                    f"{relpath}: digest/size {actual_sha}/{actual_size} does not match {owner} "
                    f"artifact entry {sha}/{size}"
                )
    return problems


def verify_manifest(
    directory: str | Path,
    public_key: Ed25519PublicKey | bytes | str | Path | None = None,
    p256_public_key: ec.EllipticCurvePublicKey | bytes | str | Path | None = None,
) -> Manifest:
    """Check an export directory; return its parsed manifest or raise ManifestError listing every problem.

    `public_key`: the pinned key (object, raw 32 bytes, base64 text, or a Path to a .pub file).
    None uses the directory's own signing_key.pub, which proves integrity but not origin.
    `p256_public_key`: the pinned P-256 key (object, SPKI DER, base64 text or a Path); the P-256
    signature is checked whenever the manifest names a P-256 key (against the shipped
    signing_key_p256.pub when none is pinned).
    Checks: signature over the exact manifest.json bytes, schema, every listed file's size and
    sha256, every artifact's digest, and that no unlisted file is present.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ManifestError(directory, [f"{directory}: not a directory"])
    key, problems = _pinned_key(directory, public_key)
    if problems:
        raise ManifestError(directory, problems)
    if public_key is not None:
        problems += _shipped_key_problems(directory, key)
    data = (directory / MANIFEST_FILE).read_bytes()
    problems += _ed25519_problems(directory, key, data)
    try:
        manifest = Manifest.model_validate_json(data)
    except ValidationError as error:
        problems.append(f"{MANIFEST_FILE}: does not follow the manifest schema: {error}")
        raise ManifestError(directory, problems) from None
    if manifest.signature.public_key_sha256 != key_fingerprint(key):
        problems.append(f"{MANIFEST_FILE}: signature.public_key_sha256 names another key")
    problems += _p256_problems(directory, manifest, data, p256_public_key)
    listed, listed_problems = _listed_file_problems(directory, manifest)
    problems += listed_problems
    problems += _unlisted_file_problems(directory, listed)
    problems += _referenced_file_problems(directory, manifest, listed)
    if problems:
        raise ManifestError(directory, problems)
    return manifest


def read_manifest(directory: str | Path) -> Manifest:
    """Parse manifest.json WITHOUT verifying anything (for tools that already verified it)."""
    return Manifest.model_validate_json((Path(directory) / MANIFEST_FILE).read_bytes())
