"""The PyTorch runtime: serves backend.pt and writes the files of the versions alignment publishes.

Only a replica with torch installed (`[alignment]`) imports this module (server/services/runtimes.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from harmony_mobile.server.services.backend_files import BackendFileError, read_onnx_backend
from harmony_mobile.server.services.registry import ModelRegistry, ServedVersion, sha256_file

from harmony_mobile.models import Backend, ProjectionHead
from harmony_mobile.protocol.slots import SlotTable
from harmony_mobile.run_dir import RunDirError, load_backend_file, save_backend, save_backend_onnx

log = logging.getLogger("harmony_mobile.server.torch_runtime")
CHECK_ROWS = 64  # replay rows an ONNX back-end is checked on against PyTorch before it is stored


def served_version(
    version: str,
    sha: str,
    backend: Backend,
    projection: ProjectionHead,
    class_names: tuple[str, ...],
    replay: torch.Tensor,
    slot_table: SlotTable,
) -> ServedVersion:
    backend, projection = backend.eval(), projection.eval()

    def forward(features: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return backend(torch.from_numpy(features)).numpy()

    return ServedVersion(
        version,
        sha,
        slot_table,
        backend.num_classes,
        backend.interface.shape,
        forward,
        TorchRuntime.name,
        backend,
        projection,
        class_names,
        replay.to(torch.float16),
    )


class TorchRuntime:
    name = "torch"

    def __init__(self, threads: int | None):
        self.threads = threads

    def start(self) -> None:
        if self.threads is not None:
            torch.set_num_threads(self.threads)

    def check_import(self, source: Path, onnx_file: Path, sha: str) -> tuple[str, int]:
        try:
            loaded = load_backend_file(source)  # validates the file before it enters the registry
        except RunDirError as error:
            raise BackendFileError(str(error)) from None
        return loaded.model_version, int(loaded.replay.shape[0])

    def onnx_matches(self, onnx_file: Path, sha: str) -> bool:
        """Whether the export's ONNX back-end is worth storing for replicas without torch: one
        converted from this backend.pt. A bad one is skipped (logged), not fatal, on this runtime."""
        if not onnx_file.is_file():
            return False
        try:
            matches = read_onnx_backend(onnx_file, threads=1).backend_sha256 == sha
        except (BackendFileError, ImportError) as error:
            log.warning("not storing %s for replicas without torch: %s", onnx_file, error)
            return False
        if not matches:
            log.warning("not storing %s: it was converted from another backend.pt", onnx_file)
        return matches

    def load(self, registry: ModelRegistry, version: str, sha: str) -> ServedVersion:
        loaded = load_backend_file(registry.local_artifact(sha))
        return served_version(
            version,
            sha,
            loaded.backend,
            loaded.projection,
            loaded.class_names,
            loaded.replay,
            loaded.slot_table,
        )

    def write_version(self, scratch: Path, model: ServedVersion) -> tuple[Path, Path]:
        pt_file = scratch / "backend.pt"
        save_backend(
            pt_file,
            model.backend,
            model.projection,
            model.version,
            model.class_names,
            model.slot_table,
            model.replay,
        )
        return pt_file, scratch / "backend.onnx"

    def write_onnx(self, pt_file: Path, onnx_file: Path, model: ServedVersion) -> bool:
        """The version's ONNX back-end for replicas without torch; on failure (no onnxscript, a
        conversion beyond tolerance) the version is still published, for torch replicas only."""
        replay = model.replay
        if replay.shape[0]:
            sample = replay[:CHECK_ROWS].float()
        else:  # no replay set: random interface features (seeded) still exercise every weight
            sample = torch.randn(8, *model.interface_shape, generator=torch.Generator().manual_seed(0))
        try:
            save_backend_onnx(
                onnx_file,
                model.backend,
                model.version,
                model.slot_table,
                sha256_file(pt_file),
                int(replay.shape[0]),
                sample,
            )
        except (ImportError, ValueError, RuntimeError) as error:
            log.warning(
                "version %s gets no ONNX back-end (replicas without torch cannot serve it): %s",
                model.version,
                error,
            )
            return False
        return True
