"""A phone client written from docs/PROTOCOL.md alone: no project code is imported (stdlib, httpx,
cryptography, numpy; the ExecuTorch runtime only to run the tier's .pte, as a phone does).

`run_ten_steps` follows the document's "Integrate a phone in ten steps" against a live server and
returns what it saw; tests/test_protocol_docs_client.py runs it against `harmony serve` on a real
export. Every detail here is one the document states; where writing it needed a guess, the document
was changed instead (its introduction says how the document was checked).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import hmac
import json
import math
import os
import secrets
import struct
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MODEL = "harmony-backend"


class ProtocolError(Exception):
    """The server answered an error: the sentence of its body (conventions: `error`, else `detail`)."""


def error_sentence(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"]
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return body["detail"]
    return response.text


def expect(response: httpx.Response, *statuses: int) -> httpx.Response:
    if response.status_code not in statuses:
        raise ProtocolError(f"{response.status_code}: {error_sentence(response)}")
    return response


# ---------------------------------------------------------------- step 1: provisioning


@dataclass
class Provisioning:
    ed25519_key: Ed25519PublicKey
    p256_key: ec.EllipticCurvePublicKey
    ed25519_raw: bytes
    p256_der: bytes
    federation_secret: bytes  # raw bytes, never their hex text


def provision(export_dir: Path, federation_secret: bytes) -> Provisioning:
    """signing_key.pub: base64 of the raw 32-byte Ed25519 key; signing_key_p256.pub: base64 of the
    91-byte DER SubjectPublicKeyInfo; one line each, no newline (section 2.2)."""
    raw = base64.b64decode((export_dir / "signing_key.pub").read_bytes(), validate=True)
    der = base64.b64decode((export_dir / "signing_key_p256.pub").read_bytes(), validate=True)
    assert len(raw) == 32 and len(der) == 91 and len(federation_secret) >= 16
    p256 = serialization.load_der_public_key(der)
    assert isinstance(p256, ec.EllipticCurvePublicKey)
    return Provisioning(Ed25519PublicKey.from_public_bytes(raw), p256, raw, der, federation_secret)


# ---------------------------------------------------------------- step 2: enrolment


def enrol(base: str, admin_token: str, tier: str) -> dict:
    response = httpx.post(
        f"{base}/v1/devices",
        json={"name": "docs-client", "tier": tier},
        headers={"Authorization": f"Bearer {admin_token}"},
    )
    return expect(response, 201).json()


# ---------------------------------------------------------------- step 3: the manifest


def verify_manifest(manifest: bytes, ed25519_sig: str, p256_sig: str, keys: Provisioning) -> dict:
    """Both signatures over the bytes as received, then parse (section 2.2, 2.3)."""
    keys.ed25519_key.verify(base64.b64decode(ed25519_sig, validate=True), manifest)
    keys.p256_key.verify(base64.b64decode(p256_sig, validate=True), manifest, ec.ECDSA(hashes.SHA256()))
    parsed = json.loads(manifest.decode("utf-8"))
    signature = parsed["signature"]
    assert signature["public_key_sha256"] == hashlib.sha256(keys.ed25519_raw).hexdigest()
    assert signature["p256"]["public_key_sha256"] == hashlib.sha256(keys.p256_der).hexdigest()
    return parsed


def fetch_manifest(base: str, token: str, keys: Provisioning) -> tuple[bytes, dict]:
    auth = {"Authorization": f"Bearer {token}"}
    manifest = expect(httpx.get(f"{base}/v1/manifest", headers=auth), 200)
    ed = expect(httpx.get(f"{base}/v1/manifest.sig", headers=auth), 200)
    p256 = expect(httpx.get(f"{base}/v1/manifest.p256.sig", headers=auth), 200)
    assert manifest.headers["content-type"] == "application/json"
    assert ed.headers["content-type"] == p256.headers["content-type"] == "text/plain; charset=utf-8"
    parsed = verify_manifest(manifest.content, ed.text, p256.text, keys)
    tampered = manifest.content.replace(b'"threshold"', b'"threshold" ', 1)
    try:
        verify_manifest(tampered, ed.text, p256.text, keys)
    except InvalidSignature:
        return manifest.content, parsed
    raise AssertionError("a tampered manifest verified")


# ---------------------------------------------------------------- step 4 and 5: the tier's front-end


def find_tier_entry(manifest: dict, tier: str) -> dict:
    return next(entry for entry in manifest["tiers"] if entry["name"] == tier)


def verified_artifact(export_dir: Path, entry: dict) -> bytes:
    """The tier's fp32 .pte, checked against its sha256 and size in the verified manifest."""
    artifact = next(a for a in entry["artifacts"] if a["format"] == "pte" and a["quantization"] == "fp32")
    data = (export_dir / artifact["path"]).read_bytes()
    assert len(data) == artifact["size"] and hashlib.sha256(data).hexdigest() == artifact["sha256"]
    return data


def normalize(pixels: np.ndarray, normalization: dict) -> np.ndarray:
    """(pixel * pixel_scale - mean[c]) / std[c] in float64, then rounded to float32; NCHW."""
    x = pixels.astype(np.float64)
    mean = np.asarray(normalization["mean"], np.float64).reshape(1, -1, 1, 1)
    std = np.asarray(normalization["std"], np.float64).reshape(1, -1, 1, 1)
    return ((x * normalization["pixel_scale"] - mean) / std).astype(np.float32)


class FrontEnd:
    """The .pte on the ExecuTorch runtime: method `forward`, one input (the tier's `input`), outputs
    in the order of the tier's `outputs` (exit_logits, features)."""

    def __init__(self, program: bytes, entry: dict):
        from executorch.runtime import Runtime  # the phone's runtime; its Python binding takes torch tensors

        self._program = Runtime.get().load_program(program)
        self.method = self._program.load_method("forward")
        self.names = [output["name"] for output in entry["outputs"]]

    def run(self, image: np.ndarray) -> dict[str, np.ndarray]:
        import torch

        outputs = self.method.execute([torch.from_numpy(np.ascontiguousarray(image))])
        return {name: out.numpy().copy() for name, out in zip(self.names, outputs, strict=True)}


# ---------------------------------------------------------------- section 3: tokens, exit order, slots


def label_token(secret: bytes, epoch: str, name: str) -> bytes:
    key = HKDF(hashes.SHA256(), 32, None, b"harmony/label-token/" + epoch.encode("ascii")).derive(secret)
    return hmac.new(key, name.encode("utf-8"), "sha256").digest()[:8]


def exit_order(secret: bytes, epoch: str, class_names: list[str]) -> list[int]:
    """Output j of the exit head -> class index: classes sorted by (token, UTF-8 name), unsigned bytes."""
    keyed = [(label_token(secret, epoch, n), n.encode("utf-8"), i) for i, n in enumerate(class_names)]
    return [i for _, _, i in sorted(keyed)]


def exit_decision(logits: np.ndarray, threshold: float) -> tuple[bool, int]:
    """(answer locally, exit output index): max softmax in float64 >= threshold; first index on a tie."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    return bool(p.max() >= threshold), int(np.argmax(p))


def slot_classes(
    secret: bytes, epoch: str, class_names: list[str], slot_table: list[str]
) -> list[int | None]:
    by_token = {label_token(secret, epoch, n).hex(): i for i, n in enumerate(class_names)}
    return [by_token.get(token) for token in slot_table]


# ---------------------------------------------------------------- section 5 and 6: inference


def hmft(array: np.ndarray) -> bytes:
    head = b"HMFT" + bytes([1, 1, array.ndim, 0]) + struct.pack(f"<{array.ndim}I", *array.shape)
    return head + np.ascontiguousarray(array, "<f4").tobytes()


def infer_hmft(base: str, token: str, features: np.ndarray, tier: str) -> dict:
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/octet-stream",
        "X-Harmony-Tier": tier,
    }
    response = httpx.post(f"{base}/v2/models/{MODEL}/infer", content=hmft(features), headers=headers)
    return expect(response, 200).json()


def infer_binary_extension(base: str, token: str, features: np.ndarray) -> tuple[dict, dict[str, np.ndarray]]:
    """Section 6.1.1: JSON header then raw little-endian FP32 bytes, no separator; every output
    asked in binary, read back from the bytes after the response's JSON header, in output order."""
    raw = np.ascontiguousarray(features, "<f4").tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "features",
                    "shape": list(features.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        },
        separators=(",", ":"),
    ).encode()
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    response = expect(
        httpx.post(f"{base}/v2/models/{MODEL}/infer", content=header + raw, headers=headers), 200
    )
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers["inference-header-content-length"])
    answer = json.loads(response.content[:length])
    tensors, position = {}, length
    for output in answer["outputs"]:
        size = output["parameters"]["binary_data_size"]
        dtype = {"FP32": "<f4", "INT64": "<i8"}[output["datatype"]]
        chunk = response.content[position : position + size]
        tensors[output["name"]] = np.frombuffer(chunk, dtype).reshape(output["shape"])
        position += size
    assert position == len(response.content)
    return answer, tensors


# ---------------------------------------------------------------- section 4: uploads


def clip_and_noise(z: np.ndarray, clip: float | None, sigma: float | None) -> np.ndarray:
    """Each row z * min(1, C / ||z||) over its whole 4096 values, then N(0, (sigma C)^2) per value
    from the operating system's CSPRNG (Box-Muller on os.urandom)."""
    if clip is None:
        return z
    flat = z.reshape(len(z), -1).astype(np.float64)
    norms = np.linalg.norm(flat, axis=1, keepdims=True)
    clipped = flat * np.minimum(1.0, clip / np.maximum(norms, 1e-12))
    if sigma:
        u = np.frombuffer(os.urandom(8 * clipped.size * 2), "<u8").reshape(2, -1) / 2.0**64
        gauss = np.sqrt(-2 * np.log1p(-u[0])) * np.cos(2 * math.pi * u[1])
        clipped = clipped + gauss.reshape(clipped.shape) * sigma * clip
    return clipped.astype(np.float32).reshape(z.shape)


def randomized_class(true_class: int, epsilon: float, classes: int) -> int:
    """Keep with p = e^eps / (e^eps + C - 1), else one of the other C - 1 classes, uniformly (CSPRNG)."""
    keep = math.exp(epsilon) / (math.exp(epsilon) + classes - 1)
    if secrets.randbelow(2**53) / 2**53 < keep:
        return true_class
    return (true_class + 1 + secrets.randbelow(classes - 1)) % classes


@dataclass
class LabelDraws:
    """One draw per sample, kept for good (a phone keeps it in private storage)."""

    draws: dict[str, tuple[int, int]] = field(default_factory=dict)

    def drawn(self, sample_id: str, confirmed: int, epsilon: float, classes: int) -> int:
        stored = self.draws.get(sample_id)
        if stored is None or stored[0] != confirmed:
            stored = self.draws[sample_id] = (confirmed, randomized_class(confirmed, epsilon, classes))
        return stored[1]


# upload metadata key -> the manifest run key whose number it copies (section 4.4)
PROTECTIONS = (
    ("clip_norm", "feature_clip"),
    ("noise_multiplier", "noise_multiplier"),
    ("label_dp_epsilon", "label_dp_epsilon"),
)


def upload_plaintext(metadata: dict, features: np.ndarray) -> bytes:
    text = json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return b"HMUP\x01" + struct.pack("<I", len(text)) + text + hmft(features)


def associated_data(device_id: str, label_epoch: str, message_id: uuid.UUID) -> bytes:
    device = device_id.encode("utf-8")
    epoch = label_epoch.encode("ascii")
    return (
        b"harmony/upload-ad/v2"
        + struct.pack("<H", len(device))
        + device
        + bytes([len(epoch)])
        + epoch
        + message_id.bytes
    )


def seal(server_public_key: bytes, plaintext: bytes, ad: bytes) -> bytes:
    ephemeral = X25519PrivateKey.generate()
    e_pub = ephemeral.public_key().public_bytes_raw()
    shared = ephemeral.exchange(X25519PublicKey.from_public_bytes(server_public_key))
    key = HKDF(hashes.SHA256(), 32, e_pub + server_public_key, b"harmony/upload-seal/v1").derive(shared)
    nonce = os.urandom(12)
    return b"HMSE\x01" + e_pub + nonce + AESGCM(key).encrypt(nonce, plaintext, ad)


# ---------------------------------------------------------------- the ten steps


@dataclass
class Seen:
    """What the client observed, for the test to check."""

    tier: str
    exits: int = 0
    asked: int = 0
    exit_order: list[int] = field(default_factory=list)  # exit output j -> class index
    local_classes: list[int] = field(default_factory=list)  # the exit head's answer, through the exit order
    top_slots: list[int] = field(default_factory=list)
    named_by_server: list[int | None] = field(default_factory=list)
    extension_top_slots: list[int] = field(default_factory=list)
    receipts: list[dict] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def run_ten_steps(
    base: str, admin_token: str, export_dir: Path, federation_secret: bytes, tier: str, pixels: np.ndarray
) -> Seen:
    keys = provision(export_dir, federation_secret)  # 1
    device = enrol(base, admin_token, tier)  # 2
    token, seen = device["token"], Seen(tier)
    manifest_bytes, manifest = fetch_manifest(base, token, keys)  # 3
    assert device["manifest"].encode("utf-8") == manifest_bytes
    entry = find_tier_entry(manifest, tier)  # 4
    front_end = FrontEnd(verified_artifact(export_dir, entry), entry)
    names, epoch = manifest["class_names"], manifest["label_epoch"]
    order = seen.exit_order = exit_order(federation_secret, epoch, names)
    slot_tables = {device["default_version"]: device["slot_table"]}
    features = []
    for image in normalize(pixels, entry["normalization"]):  # 5
        out = front_end.run(image[None])
        features.append(out["features"][0])
        local, j = exit_decision(out["exit_logits"][0], entry["threshold"])  # 6
        seen.exits += local
        seen.local_classes.append(order[j])
        answer = infer_hmft(base, token, out["features"], tier)  # 7: asked every time, to check the path
        seen.asked += 1
        version = answer["model_version"]
        if version not in slot_tables:
            metadata = httpx.get(
                f"{base}/v2/models/{MODEL}/versions/{version}", headers={"Authorization": f"Bearer {token}"}
            )
            slot_tables[version] = expect(metadata, 200).json()["parameters"]["slot_table"]
        top = {o["name"]: o["data"] for o in answer["outputs"]}["top_slot"][0]
        seen.top_slots.append(top)
        classes = slot_classes(federation_secret, epoch, names, slot_tables[version])  # 8
        seen.named_by_server.append(classes[top] if top < len(classes) else None)
    batch = np.stack(features)
    _, tensors = infer_binary_extension(base, token, batch)
    seen.extension_top_slots = tensors["top_slot"].tolist()
    upload(base, token, device, manifest, entry, batch, federation_secret, seen)  # 9, 10
    return seen


def protected_upload(
    manifest: dict, entry: dict, batch: np.ndarray, secret: bytes, draws: LabelDraws
) -> bytes:
    """The HMUP plaintext of `batch` with the protections the manifest's run turns on (section 4.4);
    the user confirmed class i % C for row i."""
    run = manifest["run"]
    names, epoch = manifest["class_names"], manifest["label_epoch"]
    confirmed = [i % len(names) for i in range(len(batch))]
    if run.get("label_dp_epsilon") is not None:
        ids = [hashlib.sha256(np.ascontiguousarray(row, "<f4").tobytes()).hexdigest() for row in batch]
        epsilon = run["label_dp_epsilon"]
        confirmed = [draws.drawn(i, c, epsilon, len(names)) for i, c in zip(ids, confirmed, strict=True)]
    rows = clip_and_noise(batch, run.get("feature_clip"), run.get("noise_multiplier"))
    metadata = {
        "label_tokens": [label_token(secret, epoch, names[c]).hex() for c in confirmed],
        "split_depths": [entry["split_depth"]] * len(rows),
        "family": entry["family"],
        "tier": entry["name"],
        "model_version": manifest["model_version"],
    }
    for key, run_key in PROTECTIONS:
        if run.get(run_key) is not None:
            metadata[key] = run[run_key]
    return upload_plaintext(metadata, rows)


def sealed_body(device: dict, label_epoch: str, plaintext: bytes) -> bytes:
    """The JSON body of POST /v1/uploads under a fresh message id: what a phone queues and resends."""
    message_id = uuid.uuid4()
    ad = associated_data(device["device_id"], label_epoch, message_id)
    envelope = seal(base64.b64decode(device["server_public_key"]), plaintext, ad)
    body = {
        "label_epoch": label_epoch,
        "message_id": str(message_id),
        "envelope": base64.b64encode(envelope).decode(),
    }
    return json.dumps(body, separators=(",", ":")).encode()


def upload(
    base: str, token: str, device: dict, manifest: dict, entry: dict, batch, secret, seen: Seen
) -> None:
    epoch = manifest["label_epoch"]
    body = sealed_body(device, epoch, protected_upload(manifest, entry, batch, secret, LabelDraws()))
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json; charset=utf-8",  # as OkHttp labels JSON
        "Content-Encoding": "gzip",
    }
    compressed = gzip.compress(body)
    for _ in range(2):  # the second send is a retry after a lost answer: the same bytes
        response = httpx.post(f"{base}/v1/uploads", content=compressed, headers=headers)
        seen.receipts.append(expect(response, 200, 201).json())
    wrong_tier = {**entry, "split_depth": entry["split_depth"] + 98}
    plaintext = protected_upload(manifest, wrong_tier, batch, secret, LabelDraws())
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    response = httpx.post(
        f"{base}/v1/uploads", content=sealed_body(device, epoch, plaintext), headers=headers
    )
    if response.status_code == 422:
        seen.refused.append(error_sentence(response))
