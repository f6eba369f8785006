"""Fixtures for the export tests (imported by tests/test_export*.py; not a shared conftest).

`fake_export_dir` writes a small export directory of dummy bytes (no torch work) for the
manifest/signing tests. `make_run_dir` writes a run directory in exactly the run_dir.py format
with random-initialized front-ends, for the pipeline tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from harmony_mobile.export.keys import load_or_create_p256_signing_key, load_or_create_signing_key
from harmony_mobile.export.manifest import (
    BackendEntry,
    Normalization,
    TierEntry,
    build_manifest,
    write_signed_manifest,
)

from harmony_mobile.data import DatasetError, ImageDataset, load_dataset
from harmony_mobile.models import Backend, ProjectionHead, Tier, TierSet, load_tiers
from harmony_mobile.protocol.label_tokens import class_tokens, epoch_key
from harmony_mobile.protocol.slots import SlotTable
from harmony_mobile.run_dir import (
    SECRET_FILE,
    ClientArtifact,
    RunInfo,
    build_front_end,
    save_backend,
    save_client,
    write_run_info,
)
from tests.helpers.manifest import Artifact, digits_tier_entry, write_files

FIXTURE_SECRET = b"fixture-federation-secret-32byte"
FIXTURE_EPOCH = "e-fixture"
CLASS_NAMES = tuple(str(i) for i in range(10))
FAKE_FILES = {
    "entry-android/front_fp32.pte": b"PTE fp32 " * 40,
    "entry-android/front_int8.pte": b"PTE int8 " * 20,
    "mid-ios/front_coreml-fp16.mlpackage/Manifest.json": b'{"fileFormatVersion": "1.0.0"}',
    "mid-ios/front_coreml-fp16.mlpackage/Data/com.apple.CoreML/model.mlmodel": b"\x08\x07spec" * 30,
    "mid-ios/front_coreml-fp16.mlpackage/Data/com.apple.CoreML/weights/weight.bin": b"\x00\x01" * 64,
    "backend/backend.pt": b"torch state " * 10,
    "backend/backend.pt2": b"exported program " * 10,
    "verification.json": b"{}\n",
}


def fake_tier(directory: Path, name: str, artifacts: list[Artifact], client_id: int = 0) -> TierEntry:
    return digits_tier_entry(
        directory,
        name,
        artifacts,
        family="cnn",
        split_depth=1,
        width=1.0,
        threshold=0.9,
        normalization=Normalization(mean=[0.3053], std=[0.3247]),
        client_id=client_id,
        parameters=1234,
        latency_budget_ms=2.0,
    )


def fake_export_dir(
    directory: Path,
    key_dir: Path,
    client_ids: dict[str, int] | None = None,
    class_names: tuple[str, ...] = CLASS_NAMES,
) -> Path:
    """A signed export directory of dummy files (its tiers' front-ends those of `client_ids`, by
    tier; client 0 by default); returns it."""
    client_ids = client_ids or {}
    directory.mkdir(parents=True)
    write_files(directory, FAKE_FILES)
    key, _ = load_or_create_signing_key(key_dir)
    p256_key, _ = load_or_create_p256_signing_key(key_dir)
    tiers = [
        fake_tier(
            directory,
            "entry-android",
            [
                ("xnnpack", "fp32", "entry-android/front_fp32.pte"),
                ("xnnpack", "int8", "entry-android/front_int8.pte"),
            ],
            client_ids.get("entry-android", 0),
        ),
        fake_tier(
            directory,
            "mid-ios",
            [("coreml", "coreml-fp16", "mid-ios/front_coreml-fp16.mlpackage")],
            client_ids.get("mid-ios", 0),
        ),
    ]
    backend = BackendEntry.describe("test-v1", [64, 8, 8], 10)
    manifest = build_manifest(
        directory,
        model_version="test-v1",
        run={"dataset": "digits", "algorithm": "test", "seed": 0},
        class_names=list(class_names),
        label_epoch="e-test",
        # the tokens of the class names under FIXTURE_SECRET: this export belongs to that secret
        slot_table=[t.hex() for t in class_tokens(epoch_key(FIXTURE_SECRET, "e-test"), class_names)],
        interface_shape=[64, 8, 8],
        backend=backend,
        tiers=tiers,
        public_key=key.public_key(),
        reports=["verification.json"],
        created_at="2026-01-01T00:00:00Z",
        p256_public_key=p256_key.public_key(),
    )
    write_signed_manifest(directory, manifest, key, p256_key)
    return directory


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


# --------------------------------------------------------------------------- a small run directory

# Two default tiers (cnn depth 1 with fp32+int8; resnet depth 2 with every variant incl. Core ML)
# and a fp32-only tier that keeps the CLI test quick.
TEST_TIERS = TierSet(
    tiers=(
        load_tiers().get("entry-android"),
        load_tiers().get("mid-ios"),
        Tier(name="tiny", family="cnn", split_depth=1, quantization=("fp32",), backends=("xnnpack",)),
    )
)


def digits_or_random(seed: int = 0) -> ImageDataset:
    """The bundled digits data set; random tensors of the same shape if it cannot be loaded."""
    try:
        return load_dataset("digits")
    except (ImportError, DatasetError):
        generator = torch.Generator().manual_seed(seed)
        return ImageDataset(
            name="digits",
            images=torch.randn(600, 1, 28, 28, generator=generator),
            labels=torch.randint(0, 10, (600,), generator=generator),
            class_names=tuple(str(i) for i in range(10)),
            mean=(0.3053,),
            std=(0.3247,),
        )


def _slot_tokens(class_names, slot_classes: list[int] | None) -> list[bytes]:
    tokens = class_tokens(epoch_key(FIXTURE_SECRET, FIXTURE_EPOCH), class_names)
    return tokens if slot_classes is None else [tokens[c] for c in slot_classes]


def make_run_dir(
    path: Path,
    tiers: TierSet = TEST_TIERS,
    clients_per_tier: int = 2,
    seed: int = 0,
    finished: bool = True,
    with_backend: bool = True,
    front_end_states: dict[str, dict] | None = None,
    algorithm_config: dict | None = None,
    replay_rows: int = 0,
    slot_classes: list[int] | None = None,
) -> Path:
    """A run directory in the run_dir.py format: random-initialized front-ends, fixed random indices;
    `algorithm_config` as the run's, a replay set of `replay_rows` random feature rows, and slot s
    holding class `slot_classes[s]` (default: class s)."""
    data = digits_or_random(seed)
    info = RunInfo.of_dataset(
        data,
        algorithm="harmony",
        interface=(64, 8),
        tiers=tiers.with_input_shape(data.input_shape),
        model_version="test-run-v1",
        label_epoch=FIXTURE_EPOCH,
        seed=seed,
        train_config={"algorithm_config": algorithm_config} if algorithm_config else {},
    )
    write_run_info(path, info)
    generator = torch.Generator().manual_seed(seed)
    client_id = 0
    for tier in info.tiers.tiers:
        for _ in range(clients_per_tier):
            torch.manual_seed(seed + client_id)
            state = (front_end_states or {}).get(tier.name) or build_front_end(info, tier).state_dict()
            order = torch.randperm(len(data), generator=generator).tolist()
            save_client(
                path,
                ClientArtifact(
                    client_id=client_id,
                    tier=tier.name,
                    classes=tuple(range(data.num_classes)),
                    threshold=0.8 + 0.01 * client_id,
                    train_idx=order[:160],
                    val_idx=order[160:200],
                    test_idx=order[200:264],
                    front_end_state=state,
                ),
            )
            client_id += 1
    torch.manual_seed(seed)
    backend = Backend(info.interface_spec, info.num_classes)
    if with_backend:
        save_backend(
            path / "backend.pt",
            backend,
            ProjectionHead(backend.feature_dim, info.projection_dim),
            info.model_version,
            info.class_names,
            SlotTable(
                FIXTURE_EPOCH,
                info.num_classes,
                _slot_tokens(info.class_names, slot_classes),
            ),
            torch.randn(replay_rows, *info.interface_spec.shape, generator=generator).half()
            if replay_rows
            else None,
        )
        (path / SECRET_FILE).write_bytes(FIXTURE_SECRET)
    if finished:
        (path / "final_metrics.json").write_text(json.dumps({"id_accuracy": 0.0}) + "\n")
    return path
