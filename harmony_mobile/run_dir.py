"""The run directory: what `harmony train` writes and `harmony export` / `harmony serve` read.

It has two parts. The **server part** is what the training server computes and may hold; the
**client part** (`clients/`) is what only phones of the lineage hold. A server operator is given
the server part, never `clients/` (docs/PRIVACY.md, "What the operator holds"). Everything is
owner-only (directories 0700, files 0600): the files hold features, model weights or the secret.

RUN_DIR/                   server part
  run.json                 RunInfo: data set, tiers, interface, model version, configs (no client's classes)
  metrics.jsonl            one JSON object per round (written by training)
  final_metrics.json       present only once training finished (aggregate accuracy, no class ids)
  checkpoints/             round checkpoints for resume (meta-weights in token order, slot state)
  backend.pt               server back-end g and projection head h (state dicts) + model version
                           + label epoch and slot table (which token each output of g stands for)
                           + the replay set: label-free interface features of the clients' training
                           images, clipped and noised like uploads (float16)
  clients/                 client part
    federation_secret      the clients' federation secret: tokens labels, orders exit heads, decodes slots
    client-007.pt          one personalized front-end per client + its classes, threshold and data indices

Class-indexed rows of every model (exit heads) are in token order (federation/client.py), so
nothing in the server part, nor in an export made from it, is class-ordered.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from harmony_mobile.data import ImageDataset
from harmony_mobile.files import open_private, private_dir, save_private
from harmony_mobile.models import Backend, FamilyModel, FrontEnd, InterfaceSpec, ProjectionHead, Tier, TierSet
from harmony_mobile.protocol.label_tokens import epoch_key, exit_positions, slot_classes
from harmony_mobile.protocol.slots import SlotTable

RUN_FORMAT = 3  # 3: server part + client part (clients/), exit heads in token order
CLIENT_PART = "clients"
SECRET_FILE = f"{CLIENT_PART}/federation_secret"


def write_federation_secret(run_path: Path, secret: bytes) -> None:
    """Create the run's secret file, readable by its owner only; refuses to overwrite one (O_EXCL)."""
    private_dir(run_path)
    with open_private(Path(run_path) / SECRET_FILE, exclusive=True) as out:
        out.write(secret)


def ensure_federation_secret(run_path: Path) -> Path:
    """The run's secret file in its client part, created (32 random bytes, 0600) if missing."""
    path = Path(run_path) / SECRET_FILE
    if not path.is_file():
        write_federation_secret(Path(run_path), os.urandom(32))
    return path


class RunDirError(ValueError):
    """A run directory is missing, incomplete or of another run."""


class RunInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: int = RUN_FORMAT
    algorithm: str
    dataset: str
    data_root: str | None = None
    dataset_limit: int | None = None
    num_classes: int
    class_names: tuple[str, ...]
    input_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interface: tuple[int, int]  # (channels, size)
    projection_dim: int = 128
    tiers: TierSet
    model_version: str
    label_epoch: str  # tokens of this lineage are keyed by it (protocol/label_tokens.py)
    seed: int
    privacy: dict[str, Any] = {}  # upload protections and their accounting (privacy/feature_noise.py)
    train_config: dict[str, Any] = {}
    partition: dict[str, Any] = {}
    # the score its phones exit by, as trained; None in runs saved before it was recorded
    # (algorithms/registry.exit_gate reads their rule back)
    exit_rule: str | None = None

    @property
    def interface_spec(self) -> InterfaceSpec:
        return InterfaceSpec(*self.interface)

    @classmethod
    def of_dataset(cls, dataset: ImageDataset, **fields: Any) -> RunInfo:
        """A run's info whose data fields (name, classes, input shape, normalization) are `dataset`'s."""
        return cls(
            dataset=dataset.name,
            num_classes=dataset.num_classes,
            class_names=dataset.class_names,
            input_shape=dataset.input_shape,
            mean=dataset.mean,
            std=dataset.std,
            **fields,
        )


@dataclass
class ClientArtifact:
    """A personalized front-end as training leaves it for one client."""

    client_id: int
    tier: str
    classes: tuple[int, ...]
    threshold: float
    train_idx: list[int]
    val_idx: list[int]
    test_idx: list[int]  # ID test samples
    front_end_state: dict[str, torch.Tensor]


def client_path(run_path: Path, client_id: int) -> Path:
    return Path(run_path) / CLIENT_PART / f"client-{client_id:03d}.pt"


def write_run_info(run_path: Path, info: RunInfo) -> None:
    with open_private(Path(run_path) / "run.json", "w") as out:
        out.write(info.model_dump_json(indent=2))


def save_client(run_path: Path, client: ClientArtifact) -> None:
    save_private(client.__dict__, client_path(run_path, client.client_id))


def save_backend(
    path: Path,
    backend: Backend,
    projection: ProjectionHead,
    model_version: str,
    class_names: tuple[str, ...],
    slot_table: SlotTable,
    replay: torch.Tensor | None = None,
) -> None:
    """Write g and h with what a reader needs to rebuild them (the server loads this same file).

    `slot_table` says which label token each output of g stands for, under its label epoch; the
    server serves it, a phone decodes slots with it (protocol/slots.py).

    `replay` (N, *interface) is the back-end's replay set: features without labels or tokens that
    the server's alignment rounds distill on (harmony_mobile/federation/replay.py); stored as float16."""
    state = {
        "model_version": model_version,
        "interface": list(backend.interface.shape),
        "num_classes": backend.num_classes,
        "class_names": list(class_names),
        "label_epoch": slot_table.label_epoch,
        "slot_table": slot_table.to_hex(),
        "projection_dim": projection.mlp[-1].out_features,
        "backend": backend.state_dict(),
        "projection": projection.state_dict(),
    }
    if replay is not None and replay.shape[0] > 0:
        if tuple(replay.shape[1:]) != tuple(backend.interface.shape):
            raise ValueError(
                f"replay features have shape {list(replay.shape)}; expected N rows of {list(backend.interface.shape)}"
            )
        state["replay"] = replay.detach().to(torch.float16).contiguous()
    save_private(state, path)


def backend_onnx_bytes(
    backend: Backend,
    model_version: str,
    slot_table: SlotTable,
    backend_sha256: str,
    replay_rows: int,
    sample: torch.Tensor,
) -> tuple[bytes, float]:
    """g as an ONNX back-end file (harmony_mobile/onnx_backend.py) for the back-end file whose sha256
    is `backend_sha256`, and the max |logit difference| between ONNX Runtime and PyTorch on
    `sample` (N, *interface); a difference above onnx_backend.TOLERANCE is a ValueError.

    torch.onnx.export's exporter (torch.export, then onnxscript) needs the onnx and onnxscript
    packages, the check onnxruntime: the export and alignment extras hold them."""
    import onnx

    from harmony_mobile.onnx_backend import (
        INPUT_NAME,
        METADATA_KEY,
        OUTPUT_NAME,
        TOLERANCE,
        backend_metadata,
        load_onnx_backend,
    )

    # the exporter warns on every call about torchvision ops it cannot register (no torchvision here)
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    backend = copy.deepcopy(backend).eval()  # export must not touch a model other threads serve
    # traced on two rows: a batch of 1 would let the exporter specialize the batch axis to 1
    example = torch.zeros(2, *backend.interface.shape)
    program = torch.onnx.export(
        backend,
        (example,),
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_shapes=({0: torch.export.Dim("batch", min=1)},),
        dynamo=True,
        verbose=False,
    )
    model = program.model_proto
    meta = backend_metadata(
        model_version,
        slot_table.label_epoch,
        slot_table.to_hex(),
        backend.num_classes,
        backend.interface.shape,
        backend_sha256,
        replay_rows,
    )
    model.metadata_props.add(key=METADATA_KEY, value=meta)
    content = model.SerializeToString()
    onnx.checker.check_model(model)
    with torch.inference_mode():
        expected = backend(sample.float()).numpy()
    difference = float(
        abs(load_onnx_backend(content, threads=1).forward(sample.float().numpy()) - expected).max()
    )
    if not difference <= TOLERANCE:
        raise ValueError(f"the ONNX back-end differs from PyTorch by {difference:.3g} (> {TOLERANCE})")
    return content, difference


def save_backend_onnx(path: Path, *args: Any) -> float:
    """backend_onnx_bytes written to `path` (owner-only); returns the check's max difference."""
    content, difference = backend_onnx_bytes(*args)
    with open_private(Path(path)) as out:
        out.write(content)
    return difference


@dataclass
class BackendFileContents:
    """What a backend.pt file holds (load_backend_file): g, its projection head, and what serving
    and alignment need with them."""

    backend: Backend
    projection: ProjectionHead
    model_version: str
    class_names: tuple[str, ...]
    replay: torch.Tensor  # (N, *interface) float16; N = 0 for a file written without a replay set
    slot_table: SlotTable

    @property
    def label_epoch(self) -> str:
        return self.slot_table.label_epoch


BACKEND_KEYS = (
    "model_version",
    "class_names",
    "num_classes",
    "interface",
    "projection_dim",
    "backend",
    "projection",
)


def _read_backend_state(path: Path) -> dict[str, Any]:
    """The dict `save_backend` wrote, or a one-line RunDirError naming the file and what is wrong."""
    if not path.is_file():
        raise RunDirError(f"no server back-end at {path}")
    try:
        state = torch.load(path, weights_only=True)
    except Exception as error:  # torch raises anything from IndexError to UnpicklingError on bad bytes
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RunDirError(
            f"{path} is not a back-end file written by `harmony train` (torch.load failed: {reason});"
            " it may be truncated or a placeholder: re-run `harmony export`"
        ) from None
    if not isinstance(state, dict):
        raise RunDirError(f"{path} is not a back-end file: it holds a {type(state).__name__}, not a dict")
    missing = [key for key in BACKEND_KEYS if key not in state]
    if missing:
        raise RunDirError(f"{path} is not a back-end file: it has no {', '.join(missing)}")
    if "label_epoch" not in state or "slot_table" not in state:
        raise RunDirError(
            f"{path} has no label epoch and slot table: it predates slot-space training; retrain it"
        )
    return state


def _backend_modules(path: Path, state: dict[str, Any]) -> tuple[Backend, ProjectionHead]:
    try:
        channels, size, _ = state["interface"]
        backend = Backend(InterfaceSpec(channels, size), state["num_classes"])
        backend.load_state_dict(state["backend"])
        projection = ProjectionHead(backend.feature_dim, state["projection_dim"])
        projection.load_state_dict(state["projection"])
    except (RuntimeError, ValueError, TypeError, KeyError, AttributeError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RunDirError(f"{path}: the back-end's weights do not load: {reason}") from None
    return backend, projection


def load_backend_file(path: str | Path) -> BackendFileContents:
    """Read a file written by `save_backend` (RUN_DIR/backend.pt, or the export's copy); modules in eval mode.
    Anything else (a truncated or placeholder file, another pickle) is a one-line RunDirError."""
    path = Path(path)
    state = _read_backend_state(path)
    backend, projection = _backend_modules(path, state)
    try:
        slot_table = SlotTable.from_hex(state["label_epoch"], state["num_classes"], state["slot_table"])
    except (ValueError, TypeError) as error:
        raise RunDirError(f"{path}: bad slot table: {error}") from None
    replay = state.get("replay", torch.zeros(0, *backend.interface.shape, dtype=torch.float16))
    if not isinstance(replay, torch.Tensor) or tuple(replay.shape[1:]) != tuple(backend.interface.shape):
        shape = list(replay.shape) if isinstance(replay, torch.Tensor) else type(replay).__name__
        raise RunDirError(
            f"{path}: replay features have shape {shape}, not N rows of {list(backend.interface.shape)}"
        )
    return BackendFileContents(
        backend.eval(),
        projection.eval(),
        str(state["model_version"]),
        tuple(state["class_names"]),
        replay.to(torch.float16),
        slot_table,
    )


def build_front_end(info: RunInfo, tier: Tier) -> FrontEnd:
    """An (untrained) front-end of the tier's architecture for this run's data."""
    channels, size, _ = info.input_shape
    model = FamilyModel(tier.family, channels, size, info.num_classes, tier.width, info.interface_spec)
    return model.front_end(tier.split_depth)


class RunDir:
    """Read access to a finished training run."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        info_file = self.path / "run.json"
        if not info_file.is_file():
            raise RunDirError(
                f"{self.path} is not a harmony run directory (no run.json); run `harmony train` first"
            )
        self.info = RunInfo.model_validate_json(info_file.read_text())
        if not (self.path / "final_metrics.json").is_file():
            raise RunDirError(
                f"{self.path} holds no trained model yet (training did not finish: no final_metrics.json)"
            )

    def federation_secret(self) -> bytes:
        """The clients' secret of this lineage (the demo's phones are provisioned with it)."""
        path = self.path / SECRET_FILE
        if not path.is_file():
            raise RunDirError(f"{self.path} has no {SECRET_FILE}: its slots cannot be decoded")
        return path.read_bytes()

    def slot_to_class(self) -> torch.Tensor:
        """Phone side, for experiments on a finished run: class id of each slot of the back-end
        (-1 for a slot no class name maps to), decoded with the run's federation secret."""
        loaded = self.backend()
        key = epoch_key(self.federation_secret(), loaded.label_epoch)
        names = slot_classes(key, self.info.class_names, loaded.slot_table.tokens)
        index = {name: i for i, name in enumerate(self.info.class_names)}
        return torch.tensor([index[n] if n is not None else -1 for n in names], dtype=torch.int64)

    def exit_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Phone side (client part): data set class ids -> exit indices of this lineage's front-ends,
        whose outputs are in token order (protocol/label_tokens.exit_order)."""
        key = epoch_key(self.federation_secret(), self.info.label_epoch)
        exit_of_class = torch.tensor(exit_positions(key, self.info.class_names), dtype=torch.int64)
        return exit_of_class[torch.as_tensor(labels)]

    def final_metrics(self) -> dict[str, Any]:
        return json.loads((self.path / "final_metrics.json").read_text())

    def clients(self) -> list[ClientArtifact]:
        files = sorted((self.path / CLIENT_PART).glob("client-*.pt"))
        if not files:
            raise RunDirError(f"{self.path} has no personalized front-ends under clients/")
        return [ClientArtifact(**torch.load(f, weights_only=True)) for f in files]

    def clients_for_tier(self, tier_name: str) -> list[ClientArtifact]:
        self.info.tiers.get(tier_name)  # raises KeyError naming the known tiers
        return [c for c in self.clients() if c.tier == tier_name]

    def representative_client(self, tier_name: str) -> ClientArtifact:
        """The client whose front-end is exported for a tier: the first client of that tier."""
        clients = self.clients_for_tier(tier_name)
        if not clients:
            raise RunDirError(f"run {self.path} has no client of tier {tier_name!r}")
        return clients[0]

    def front_end(self, client: ClientArtifact) -> FrontEnd:
        front_end = build_front_end(self.info, self.info.tiers.get(client.tier))
        front_end.load_state_dict(client.front_end_state)
        return front_end.eval()

    def backend(self) -> BackendFileContents:
        return load_backend_file(self.path / "backend.pt")

    def dataset(self):
        from harmony_mobile.data import load_dataset

        return load_dataset(self.info.dataset, self.info.data_root, limit=self.info.dataset_limit)
