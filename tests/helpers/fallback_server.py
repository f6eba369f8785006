"""Shared helpers for the server tests (no tests here): a model dir with a seeded random back-end,
settings on a tmp data dir, enrolment, and sealed uploads built exactly as a phone builds them."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

import numpy as np
import torch
from harmony_mobile.server import Settings

from harmony_mobile.models import Backend, InterfaceSpec, ProjectionHead, load_tiers
from harmony_mobile.protocol.label_tokens import class_tokens, epoch_key
from harmony_mobile.protocol.sealing import AssociatedData, seal
from harmony_mobile.protocol.slots import SlotTable
from harmony_mobile.protocol.wire import UploadMetadata, encode_upload
from harmony_mobile.run_dir import save_backend

ADMIN_TOKEN = "admin-token-for-tests-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
FEDERATION_SECRET = b"federation-secret-held-by-phones"
LABEL_EPOCH = "e-server-tests"
INTERFACE = InterfaceSpec()
NUM_CLASSES = 10
TIER_FAMILIES = {t.name: t.family for t in load_tiers().tiers}
TIER_DEPTHS = {t.name: t.split_depth for t in load_tiers().tiers}
CLASS_NAMES = tuple(f"class-{c}" for c in range(NUM_CLASSES))


def class_slot_table(label_epoch: str = LABEL_EPOCH) -> SlotTable:
    """Slot c = the token of class c: the table a training run leaves when classes appear in order."""
    tokens = class_tokens(epoch_key(FEDERATION_SECRET, label_epoch), CLASS_NAMES)
    return SlotTable(label_epoch, NUM_CLASSES, tokens)


def make_model_dir(
    root: Path, seed: int = 0, model_version: str = "v1", fit_steps: int = 0, replay_rows: int = 200
) -> Path:
    """A seeded random back-end; `fit_steps` > 0 first fits it briefly to `class_features`, so that
    (like a trained back-end, unlike a random one) its predictions are confident and class-dependent.
    The file carries a replay set of `replay_rows` label-free rows of the same classes (as training
    writes one: features of the clients' training images), 0 for a file without one."""
    torch.manual_seed(seed)
    backend = Backend(INTERFACE, NUM_CLASSES)
    projection = ProjectionHead(backend.feature_dim, 32)
    if fit_steps:
        classes = np.arange(200) % NUM_CLASSES
        x, y = torch.from_numpy(class_features(classes, seed=seed + 100)), torch.from_numpy(classes)
        optimizer = torch.optim.Adam(backend.parameters(), lr=1e-3)
        for _ in range(fit_steps):
            loss = torch.nn.functional.cross_entropy(backend(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        backend.eval()
    replay = torch.from_numpy(class_features(np.arange(replay_rows) % NUM_CLASSES, seed=seed + 200))
    model_dir = Path(root) / "model"
    save_backend(
        model_dir / "backend" / "backend.pt",
        backend,
        projection,
        model_version,
        CLASS_NAMES,
        class_slot_table(),
        replay,
    )
    return model_dir


def make_settings(root: Path, model_dir: Path | None, **overrides) -> Settings:
    values = dict(
        data_dir=Path(root) / "data",
        model_dir=model_dir,
        admin_token=ADMIN_TOKEN,
        max_wait_ms=1.0,
        rate_limit_per_second=1000.0,
        rate_limit_burst=1000,
    )
    values.update(overrides)
    return Settings(**values)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def enrol(client, name: str = "phone", tier: str = "mid-android") -> dict:
    response = client.post("/v1/devices", json={"name": name, "tier": tier}, headers=ADMIN)
    assert response.status_code == 201, response.text
    return response.json()


def class_features(classes: np.ndarray, seed: int) -> np.ndarray:
    """Features with a class-dependent mean, so token positives carry real signal."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(1234).standard_normal((NUM_CLASSES, *INTERFACE.shape)).astype(np.float32)
    noise = 0.5 * rng.standard_normal((len(classes), *INTERFACE.shape)).astype(np.float32)
    return np.maximum(centres[classes] + noise, 0).astype(np.float32)  # connectors end in a ReLU


def sealed_upload(
    device: dict,
    label_epoch: str,
    classes,
    *,
    seed: int = 0,
    message_id: uuid.UUID | None = None,
    features: np.ndarray | None = None,
    **metadata_changes,
) -> dict:
    """The JSON body of POST /v1/uploads, built as docs/PROTOCOL.md section 4 says."""
    classes = np.asarray(classes)
    features = class_features(classes, seed) if features is None else features
    key = epoch_key(FEDERATION_SECRET, label_epoch)
    tokens = class_tokens(key, [CLASS_NAMES[int(c)] for c in classes])
    tier = metadata_changes.get("tier") or device.get("tier") or "mid-android"
    fields = dict(
        label_tokens=tuple(t.hex() for t in tokens),
        split_depths=(TIER_DEPTHS.get(tier, 2),) * len(classes),  # a phone's tier has one depth
        family=TIER_FAMILIES.get(tier, "mobilenet"),
        tier=tier,
        model_version="v1",
    )
    fields.update(metadata_changes)
    plaintext = encode_upload(UploadMetadata(**fields), features)
    return sealed_body(device, plaintext, label_epoch, message_id)


def sealed_body(
    device: dict, plaintext: bytes, label_epoch: str = LABEL_EPOCH, message_id: uuid.UUID | None = None
) -> dict:
    """The JSON body of POST /v1/uploads around any plaintext, sealed to the device's server key."""
    message_id = message_id or uuid.uuid4()
    envelope = seal(
        base64.b64decode(device["server_public_key"]),
        plaintext,
        AssociatedData(device["device_id"], label_epoch, message_id),
    )
    return {
        "label_epoch": label_epoch,
        "message_id": str(message_id),
        "envelope": base64.b64encode(envelope).decode(),
    }


def json_infer_body(features: np.ndarray, **extra) -> dict:
    return {
        "inputs": [
            {
                "name": "features",
                "shape": list(features.shape),
                "datatype": "FP32",
                "data": features.ravel().tolist(),
            }
        ],
        **extra,
    }


def error_message(response) -> str:
    """The one sentence of an error body, checking its key: `error` on /v2 routes (Open Inference
    Protocol), `detail` elsewhere."""
    key = "error" if response.url.path.startswith("/v2") else "detail"
    body = response.json()
    assert set(body) == {key}, body
    return body[key]
