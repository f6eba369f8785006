"""The Python device runtime: what a phone does, using only the exported artifacts and the wire protocol.

It mirrors android_demo/harmony-core (HarmonyClient, ConfirmedUploads, UploadQueue) so the demo and
the tests exercise the same behaviour as the apps, without importing the training code:

  * `load_manifest`: verify manifest.sig over the exact bytes of manifest.json with the *pinned*
    Ed25519 key, then parse it; `load_front_end` checks the artifact's sha256 and size against the
    manifest before handing the .pte to the ExecuTorch runtime.
  * `Phone.classify`: normalize the pixels as the manifest says, run the .pte, answer locally when
    max softmax(exit_logits) >= the exit threshold (the manifest's tier threshold, or the one the
    phone recalibrated after personalizing its front-end on device: `Phone.use_local_front_end`),
    else POST the features as a binary HMFT body to the server's infer endpoint (docs/PROTOCOL.md
    6.2; inference bodies are not sealed, uploads are). The server answers in slots; the phone
    turns the top slot into a class with its federation secret (the token of every manifest class
    name under the label epoch, looked up in the version's slot table; a version it has not seen
    yet: its slot table from the V2 model metadata first). A slot no class name maps to keeps
    the local answer and says so. Any server failure (down, timeout, 4xx/5xx) answers with the
    local exit instead.
  * `Phone.confirm` + `Phone.flush`: features of samples whose label the user confirmed become a
    sealed upload (label tokens of the class names under the provisioned federation secret and
    the manifest's label epoch; randomized response and feature clipping + noise when the manifest
    says the lineage trained with them; envelope bound to device id, label epoch and message id),
    stored in a bounded file-backed `UploadQueue` and sent when the server answers. An entry is deleted only on a 2xx acknowledgement; a resend uses the
    same bytes and message id, which the server stores once (PROTOCOL.md 4.6).

This module imports neither `harmony_mobile.export` nor `harmony_mobile.server`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import torch
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from harmony_mobile.privacy.feature_noise import privatize_features
from harmony_mobile.privacy.label_dp import randomized_response
from harmony_mobile.privacy.options import UploadPrivacy
from harmony_mobile.protocol.label_tokens import (
    check_label_epoch,
    class_tokens,
    epoch_key,
    slot_classes,
)
from harmony_mobile.protocol.sealing import AssociatedData, seal
from harmony_mobile.protocol.slots import TOKEN_HEX_PATTERN
from harmony_mobile.protocol.wire import UploadMetadata, encode_tensor, encode_upload

MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
PUBLIC_KEY_FILE = "signing_key.pub"
MODEL_NAME = "harmony-backend"
PERMANENT_UPLOAD_STATUSES = (400, 409, 413, 422)  # resending the same bytes cannot fix these


class DeviceError(RuntimeError):
    """The device cannot trust or load what it was given (bad signature, hash mismatch, unknown tier)."""


class QueueFullError(DeviceError):
    """The upload queue is at its bound; the new upload was refused (nothing accepted is ever dropped)."""


# --------------------------------------------------------------------------- manifest and .pte


def decode_public_key(text: str | bytes) -> Ed25519PublicKey:
    """A pinned signing key: base64 of the raw 32-byte Ed25519 key (the signing_key.pub format)."""
    raw = base64.b64decode(text.strip() if isinstance(text, str) else text.strip(), validate=True)
    if len(raw) != 32:
        raise DeviceError(f"a pinned Ed25519 key is 32 bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


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


def tier_entry(manifest: dict, tier: str) -> dict:
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


def normalize(pixels: np.ndarray | torch.Tensor, normalization: dict) -> torch.Tensor:
    """Pixels (C, H, W) or (N, C, H, W), 0..255 -> float32 NCHW, (pixel * scale - mean[c]) / std[c]."""
    x = torch.as_tensor(np.asarray(pixels), dtype=torch.float32)
    if x.dim() == 3:
        x = x.unsqueeze(0)
    mean = torch.tensor(normalization["mean"], dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(normalization["std"], dtype=torch.float32).view(1, -1, 1, 1)
    return ((x * normalization.get("pixel_scale", 1 / 255) - mean) / std).contiguous()


class FrontEndProgram:
    """One tier's .pte, loaded with the ExecuTorch runtime: image (1, C, H, W) -> (exit_logits, features)."""

    def __init__(self, program: bytes, description: str = ""):
        from executorch.runtime import Runtime

        self.description = description
        self.size = len(program)
        self._program = Runtime.get().load_program(program)  # keep the program alive with its method
        self.method = self._program.load_method("forward")
        self.batch = int(self.method.metadata.input_tensor_meta(0).sizes()[0])

    def run(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs for a batch of normalized images, run `self.batch` rows at a time."""
        logits, features = [], []
        for start in range(0, len(images), self.batch):
            chunk = images[start : start + self.batch].contiguous()
            if len(chunk) < self.batch:  # a static-batch program: pad, then drop the padding
                pad = torch.zeros(self.batch - len(chunk), *chunk.shape[1:])
                out = self.method.execute([torch.cat([chunk, pad])])
                out = [o[: len(chunk)] for o in out]
            else:
                out = self.method.execute([chunk])
            logits.append(out[0].clone())
            features.append(out[1].clone())
        return torch.cat(logits), torch.cat(features)


def load_front_end(
    export_dir: str | Path, manifest: dict, tier: str, quantization: str = "int8"
) -> FrontEndProgram:
    """The tier's .pte after checking its sha256 and size against the (verified) manifest."""
    artifact = pte_artifact(tier_entry(manifest, tier), quantization)
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
    return FrontEndProgram(data, artifact["path"])


# --------------------------------------------------------------------------- credentials and keys


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


@dataclass(frozen=True)
class FederationKey:
    """Provisioned out of band (never sent to the server): the federation secret. The label epoch
    it is used under comes from the signed manifest."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) < 16:
            raise ValueError("the federation secret must be at least 16 bytes")


def enrol(base_url: str, admin_token: str, tier: str, name: str | None = None, timeout: float = 10.0) -> dict:
    """Provisioning step (operator side, admin token): POST /v1/devices; returns the enrolment JSON."""
    response = httpx.post(
        f"{base_url}/v1/devices",
        json={"tier": tier, **({"name": name} if name else {})},
        headers={"Authorization": f"Bearer {admin_token}"},
        timeout=timeout,
    )
    if response.status_code != 201:
        raise DeviceError(f"enrolment failed: {response.status_code} {response.text}")
    return response.json()


# --------------------------------------------------------------------------- the upload queue

_ENTRY = re.compile(r"^(\d{19})-([0-9a-f-]{36})\.upload$")


@dataclass(frozen=True)
class PendingUpload:
    sequence: int
    message_id: str
    body: bytes
    path: Path


class UploadQueue:
    """A bounded, file-backed FIFO of upload request bodies that survives process death.

    Each entry is one file `<sequence>-<message id>.upload` holding the exact JSON body to POST,
    written to a temporary name, fsynced and renamed into place (readers never see half a file;
    leftover temporaries are deleted on open). The message id is fixed at enqueue time and bound
    into the sealed envelope; an entry is deleted only after a 2xx acknowledgement, so a crash
    between acknowledgement and deletion resends the same bytes, which the server stores once.
    A full queue refuses new uploads (`QueueFullError`); nothing accepted is dropped. An entry the
    server refuses for good (400/409/413/422) moves to `rejected/` instead of blocking the queue.
    """

    def __init__(self, directory: str | Path, max_entries: int = 1000, max_bytes: int = 64 * 1024 * 1024):
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("queue bounds must be positive")
        self.directory = Path(directory)
        self.max_entries, self.max_bytes = max_entries, max_bytes
        (self.directory / "rejected").mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob(".tmp-*"):
            leftover.unlink(missing_ok=True)
        entries = self._entry_files()
        self._next = (int(_ENTRY.match(entries[-1].name).group(1)) + 1) if entries else 1

    def _entry_files(self) -> list[Path]:
        return sorted(p for p in self.directory.iterdir() if _ENTRY.match(p.name))

    def __len__(self) -> int:
        return len(self._entry_files())

    def bytes(self) -> int:
        return sum(p.stat().st_size for p in self._entry_files())

    def enqueue(self, build_body) -> PendingUpload:
        """Assign a fresh message id, build the body for it (`build_body(message_id) -> bytes`), store it durably."""
        message_id = str(uuid.uuid4())
        body = build_body(message_id)
        files = self._entry_files()
        used = sum(p.stat().st_size for p in files)
        if len(files) + 1 > self.max_entries or used + len(body) > self.max_bytes:
            raise QueueFullError(
                f"upload queue full: {len(files)} entries, {used} bytes "
                f"(limits {self.max_entries} entries, {self.max_bytes} bytes)"
            )
        sequence, self._next = self._next, self._next + 1
        path = self.directory / f"{sequence:019d}-{message_id}.upload"
        temporary = self.directory / f".tmp-{message_id}"
        with open(temporary, "wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        self._sync_directory()
        return PendingUpload(sequence, message_id, body, path)

    def pending(self) -> list[PendingUpload]:
        """Queued uploads, oldest first."""
        result = []
        for path in self._entry_files():
            match = _ENTRY.match(path.name)
            result.append(PendingUpload(int(match.group(1)), match.group(2), path.read_bytes(), path))
        return result

    def remove(self, upload: PendingUpload) -> None:
        upload.path.unlink(missing_ok=True)
        self._sync_directory()

    def reject(self, upload: PendingUpload, reason: str) -> None:
        target = self.directory / "rejected" / upload.path.name
        os.replace(upload.path, target)
        target.with_suffix(".reason").write_text(reason)
        self._sync_directory()

    def rejected(self) -> int:
        return len(list((self.directory / "rejected").glob("*.upload")))

    def _sync_directory(self) -> None:
        if hasattr(os, "O_DIRECTORY"):
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


# --------------------------------------------------------------------------- the phone


@dataclass
class Classification:
    source: str  # "local", "server", "local_after_server_failure", "local_unnamed_slot"
    prediction: int
    confidence: float
    exit_prediction: int
    exit_confidence: float
    features: torch.Tensor  # (1, C, S, S): what a confirmed label would upload
    local_ms: float
    server_ms: float = 0.0
    server_version: str | None = None
    error: str | None = None


@dataclass
class PhoneStats:
    classified: int = 0
    local: int = 0
    server: int = 0
    server_failures: int = 0
    unnamed_slots: int = 0  # the server's top slot was no class of this phone: the local answer stood
    infer_bytes: int = 0  # request bodies sent to the infer endpoint
    upload_bytes: int = 0  # acknowledged upload request bodies
    uploads_acknowledged: int = 0
    upload_rows_acknowledged: int = 0
    duplicates: int = 0
    local_ms: list[float] = field(default_factory=list)


@dataclass
class FlushResult:
    delivered: int
    rejected: int
    remaining: int
    error: str | None = None


class Phone:
    """One simulated phone of one tier: the front-end .pte, the fallback server, the upload queue."""

    def __init__(
        self,
        *,
        manifest: dict,
        tier: str,
        program: FrontEndProgram,
        server_url: str,
        credentials: DeviceCredentials,
        federation_key: FederationKey,
        queue: UploadQueue,
        model_version: str | None = None,
        threshold: float | None = None,
        timeout: float = 10.0,
        connect_timeout: float = 2.0,
        http: httpx.Client | None = None,
    ):
        """`threshold`: the exit threshold tau; None = the tier's threshold in the manifest."""
        self.manifest = manifest
        self.entry = tier_entry(manifest, tier)
        self.tier = tier
        self.program = program
        self.threshold = exit_threshold(self.entry["threshold"] if threshold is None else threshold)
        self.normalization = self.entry["normalization"]
        self.credentials = credentials
        self.federation_key = federation_key
        self.queue = queue
        self.model_version = model_version or manifest["model_version"]
        self.class_names = list(manifest["class_names"])
        self.label_epoch = check_label_epoch(manifest["label_epoch"])
        self.privacy = upload_privacy(manifest)
        # back-end version -> class index of each slot (None: no class name of this phone maps to it)
        self._slot_classes: dict[str, list[int | None]] = {
            manifest["backend"]["model_version"]: self.decode_slot_table(
                self.label_epoch, manifest["slot_table"]
            )
        }
        self._noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        self.stats = PhoneStats()
        self.server_url = server_url
        self.timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self.http = self.connect(http)

    def connect(self, http: httpx.Client | None = None) -> httpx.Client:
        """(Re)open the HTTP client; tests pass their own (an in-process app, or a dead transport)."""
        http = http or httpx.Client(base_url=self.server_url, timeout=self.timeout)
        http.headers["Authorization"] = f"Bearer {self.credentials.token}"
        self.http = http
        return http

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Phone:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def use_local_front_end(self, program: FrontEndProgram, *, threshold: float, model_version: str) -> None:
        """On-device personalization replaced the front-end: answer with `program` from now on, exit
        when its confidence reaches `threshold` (tau recalibrated for it on the phone's own held-out
        samples, docs/ALGORITHM.md: Inference), and stamp uploads with `model_version`."""
        self.threshold = exit_threshold(threshold)
        self.program = program
        self.model_version = model_version

    # ---- inference

    def run_front_end(self, pixels) -> tuple[torch.Tensor, torch.Tensor, float]:
        image = normalize(pixels, self.normalization)
        started = time.perf_counter()
        logits, features = self.program.run(image)
        return logits, features, (time.perf_counter() - started) * 1e3

    def classify(self, pixels) -> Classification:
        """Answer for one image (C, H, W) of 0..255 pixels: local exit, server fallback, or local after failure."""
        logits, features, local_ms = self.run_front_end(pixels)
        probabilities = torch.softmax(logits[0].float(), dim=0)
        confidence, exit_prediction = (float(v) for v in probabilities.max(dim=0))
        exit_prediction = int(exit_prediction)
        self.stats.classified += 1
        self.stats.local_ms.append(local_ms)
        result = Classification(
            "local", exit_prediction, confidence, exit_prediction, confidence, features, local_ms
        )
        if confidence >= self.threshold:
            self.stats.local += 1
            return result
        body = encode_tensor(features.numpy())
        started = time.perf_counter()
        try:
            response = self.http.post(
                f"/v2/models/{MODEL_NAME}/infer",
                content=body,
                headers={"Content-Type": "application/octet-stream", "X-Harmony-Tier": self.tier},
            )
            self.stats.infer_bytes += len(body)
            if response.status_code != 200:
                raise DeviceError(f"{response.status_code}: {_detail(response)}")
            answer = response.json()
            outputs = {o["name"]: o["data"] for o in answer["outputs"]}
            result.server_version = answer["model_version"]
            decoded = self.slot_classes(result.server_version)
            top_slot = int(outputs["top_slot"][0])
            named = decoded[top_slot] if 0 <= top_slot < len(decoded) else None
            if named is None:
                result.source = "local_unnamed_slot"
                result.error = f"the server's top slot {top_slot} maps to none of this phone's classes"
                self.stats.unnamed_slots += 1
            else:
                result.source = "server"
                result.prediction = named
                result.confidence = float(outputs["confidence"][0])
                self.stats.server += 1
        except (httpx.HTTPError, DeviceError, KeyError, ValueError, IndexError, TypeError) as error:
            result.source = "local_after_server_failure"
            result.error = f"{type(error).__name__}: {error}"
            self.stats.server_failures += 1
        result.server_ms = (time.perf_counter() - started) * 1e3
        return result

    def decode_slot_table(self, label_epoch: str, slot_table: list[str]) -> list[int | None]:
        """Class index of each slot of a table: tokens of this phone's class names under the epoch."""
        key = epoch_key(self.federation_key.secret, label_epoch)
        names = slot_classes(key, self.class_names, parse_slot_table(slot_table))
        return [self.class_names.index(name) if name is not None else None for name in names]

    def slot_classes(self, version: str) -> list[int | None]:
        """The decoded slot table of a back-end version; one the phone has not seen yet is read from
        the V2 model metadata of that version first (docs/PROTOCOL.md, slot table)."""
        if version not in self._slot_classes:
            response = self.http.get(f"/v2/models/{MODEL_NAME}/versions/{version}")
            if response.status_code != 200:
                raise DeviceError(
                    f"slot table of version {version!r}: {response.status_code}: {_detail(response)}"
                )
            parameters = response.json()["parameters"]
            self._slot_classes[version] = self.decode_slot_table(
                check_label_epoch(parameters["label_epoch"]), parameters["slot_table"]
            )
        return self._slot_classes[version]

    # ---- confirmed uploads

    def confirm(self, features: torch.Tensor, labels) -> list[PendingUpload]:
        """Seal and queue features (N, C, S, S) of samples whose labels the user confirmed.

        Rows are split into uploads of at most the server's `max_upload_rows`. Labels become tokens
        of their class names under the manifest's label epoch (after randomized response, when the
        lineage uses label DP); features are clipped and noised when it uses that option. Only
        sealed bytes reach the disk."""
        features = torch.as_tensor(features).float()
        labels = torch.as_tensor([int(y) for y in labels], dtype=torch.int64)
        if len(labels) != len(features):
            raise ValueError(f"{len(features)} feature rows but {len(labels)} labels")
        if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < len(self.class_names):
            raise ValueError(f"labels are class indices 0..{len(self.class_names) - 1}")
        privacy = self.privacy
        if privacy.label_dp_epsilon is not None:
            labels = randomized_response(labels, privacy.label_dp_epsilon, len(self.class_names), self._noise)
        features = privatize_features(features, privacy.feature_clip, privacy.noise_multiplier, self._noise)
        rows = int(self.credentials.limits.get("max_upload_rows", 256))
        key, epoch = epoch_key(self.federation_key.secret, self.label_epoch), self.label_epoch
        queued = []
        for start in range(0, len(labels), rows):
            chunk, chunk_labels = features[start : start + rows], labels[start : start + rows].tolist()
            metadata = UploadMetadata(
                label_tokens=tuple(
                    t.hex() for t in class_tokens(key, [self.class_names[y] for y in chunk_labels])
                ),
                split_depths=(int(self.entry["split_depth"]),) * len(chunk_labels),
                family=self.entry["family"],
                tier=self.tier,
                model_version=self.model_version,
                clip_norm=privacy.feature_clip,
                noise_multiplier=privacy.noise_multiplier,
                label_dp_epsilon=privacy.label_dp_epsilon,
            )
            plaintext = encode_upload(metadata, chunk.numpy())
            queued.append(
                self.queue.enqueue(lambda message_id, p=plaintext, e=epoch: self._body(p, e, message_id))
            )
        return queued

    def _body(self, plaintext: bytes, label_epoch: str, message_id: str) -> bytes:
        ad = AssociatedData(self.credentials.device_id, label_epoch, uuid.UUID(message_id))
        envelope = seal(self.credentials.server_public_key, plaintext, ad)
        body = {
            "label_epoch": label_epoch,
            "message_id": message_id,
            "envelope": base64.b64encode(envelope).decode(),
        }
        return json.dumps(body, separators=(",", ":")).encode()

    def flush(self) -> FlushResult:
        """Send queued uploads oldest first; stop at the first transient failure (server down, 429, 5xx...)."""
        delivered = rejected = 0
        for upload in self.queue.pending():
            try:
                response = self.http.post(
                    "/v1/uploads", content=upload.body, headers={"Content-Type": "application/json"}
                )
            except httpx.HTTPError as error:
                return FlushResult(delivered, rejected, len(self.queue), f"{type(error).__name__}: {error}")
            if 200 <= response.status_code < 300:
                receipt = response.json()
                self.stats.uploads_acknowledged += 1
                self.stats.upload_rows_acknowledged += int(receipt.get("rows", 0))
                self.stats.upload_bytes += len(upload.body)
                self.stats.duplicates += bool(receipt.get("duplicate"))
                self.queue.remove(upload)
                delivered += 1
            elif response.status_code in PERMANENT_UPLOAD_STATUSES:
                self.queue.reject(upload, f"{response.status_code}: {_detail(response)}")
                rejected += 1
            else:
                error = f"{response.status_code}: {_detail(response)}"
                return FlushResult(delivered, rejected, len(self.queue), error)
        return FlushResult(delivered, rejected, len(self.queue))


def parse_slot_table(slot_table: list[str]) -> list[bytes]:
    """Slot tokens from their serialized form (16 lowercase hex characters each)."""
    if not isinstance(slot_table, list):
        raise DeviceError(f"a slot table is a list of hex tokens, got {type(slot_table).__name__}")
    for index, token in enumerate(slot_table):
        if not isinstance(token, str) or TOKEN_HEX_PATTERN.fullmatch(token) is None:
            raise DeviceError(f"slot_table[{index}] is not 16 lowercase hex characters: {token!r}")
    return [bytes.fromhex(token) for token in slot_table]


def upload_privacy(manifest: dict) -> UploadPrivacy:
    """The upload protections the lineage trained with (the manifest's `run` object says which)."""
    run = manifest.get("run", {})
    return UploadPrivacy(
        label_dp_epsilon=run.get("label_dp_epsilon"),
        feature_clip=run.get("feature_clip"),
        noise_multiplier=run.get("noise_multiplier"),
    )


def exit_threshold(value: float) -> float:
    """A usable tau: a finite number >= 0 (above 1 = never exit locally)."""
    threshold = float(value)
    if not math.isfinite(threshold) or threshold < 0:
        raise ValueError(f"an exit threshold is a finite number >= 0, got {value!r}")
    return threshold


def _detail(response: httpx.Response) -> str:
    """The error sentence: `error` on /v2 routes (Open Inference Protocol), `detail` elsewhere."""
    try:
        body = response.json()
        return str(body.get("error") or body.get("detail") or response.text)
    except ValueError:
        return response.text[:200]
