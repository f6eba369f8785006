"""Which runtime serves the back-end in this process: PyTorch or ONNX Runtime.

A replica installed with `[server]` alone has no torch: it serves each version's ONNX back-end
(<sha256>.onnx, harmony_mobile/onnx_backend.py) through ONNX Runtime and runs no alignment round,
since rounds train g with torch. `[alignment]` adds torch; such a replica serves backend.pt through
PyTorch (server/services/torch_runtime.py) and writes the ONNX back-end of every version it publishes, so
replicas of both kinds can follow the same store. `auto` picks torch when it is importable.

This module imports no torch: torch_runtime is imported only when the torch runtime is chosen.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Protocol

from harmony_mobile.server.core.settings import Settings
from harmony_mobile.server.services.backend_files import BackendFileError, read_onnx_backend
from harmony_mobile.server.services.registry import ONNX_SUFFIX, ModelRegistry, ServedVersion

log = logging.getLogger("harmony_mobile.server.runtimes")
RUNTIMES = ("auto", "torch", "onnx")


class RuntimeChoiceError(ValueError):
    """The runtime asked for cannot run here, or cannot do what the settings ask; one line naming
    the extra to install or the flag to change."""


class Runtime(Protocol):
    name: str

    def start(self) -> None: ...

    def check_import(self, source: Path, onnx_file: Path, sha: str) -> tuple[str, int]: ...

    def onnx_matches(self, onnx_file: Path, sha: str) -> bool: ...

    def load(self, registry: ModelRegistry, version: str, sha: str) -> ServedVersion: ...

    def write_version(self, scratch: Path, model: ServedVersion) -> tuple[Path, Path]: ...

    def write_onnx(self, pt_file: Path, onnx_file: Path, model: ServedVersion) -> bool: ...


def choose_runtime(runtime: str, run_alignment: bool) -> str:
    """ "torch" or "onnx" for the setting `runtime` (auto/torch/onnx) on this install."""
    has_torch = importlib.util.find_spec("torch") is not None
    chosen = ("torch" if has_torch else "onnx") if runtime == "auto" else runtime
    if chosen == "torch" and not has_torch:
        raise RuntimeChoiceError(
            "the torch runtime needs PyTorch, which is not installed: pip install 'harmony-mobile[alignment]'"
            " (or serve with --runtime onnx --no-alignment)"
        )
    if chosen == "onnx" and run_alignment:
        missing = "" if has_torch else ": pip install 'harmony-mobile[alignment]'"
        raise RuntimeChoiceError(
            "alignment rounds train the back-end with PyTorch, which the onnx runtime does not run: start"
            f" this replica with --no-alignment to serve only, or run it on the torch runtime{missing}"
        )
    if chosen == "onnx" and importlib.util.find_spec("onnxruntime") is None:
        raise RuntimeChoiceError(
            "the onnx runtime needs ONNX Runtime, which is not installed: pip install 'harmony-mobile[server]'"
        )
    return chosen


def make_runtime(settings: Settings) -> Runtime:
    if choose_runtime(settings.runtime, settings.run_alignment) == "torch":
        from harmony_mobile.server.services.torch_runtime import TorchRuntime

        return TorchRuntime(settings.torch_threads)
    return OnnxRuntime(settings.onnx_threads)


class OnnxRuntime:
    """Serves <sha256>.onnx through ONNX Runtime; imports and publishes nothing it cannot check."""

    name = "onnx"

    def __init__(self, threads: int | None):
        self.threads = threads

    def start(self) -> None:
        pass  # the thread count goes to each session (onnx_backend.session_options)

    def check_import(self, source: Path, onnx_file: Path, sha: str) -> tuple[str, int]:
        """An export's backend.pt is served from its backend.onnx: there must be one, converted
        from this very backend.pt (its sha256 in the metadata); torch would be needed to read the .pt."""
        if not onnx_file.is_file():
            raise BackendFileError(
                f"{onnx_file} is missing: a replica without torch serves the ONNX back-end that"
                " `harmony export` writes beside backend.pt; re-export, or serve on the torch runtime"
            )
        loaded = read_onnx_backend(onnx_file, self.threads)
        if loaded.backend_sha256 != sha:
            raise BackendFileError(
                f"{onnx_file} was converted from another back-end file than {source} (sha256"
                f" {loaded.backend_sha256[:12]}..., not {sha[:12]}...): re-run `harmony export`"
            )
        return loaded.model_version, loaded.replay_rows

    def onnx_matches(self, onnx_file: Path, sha: str) -> bool:
        return onnx_file.is_file()  # check_import has checked it, or refused the export

    def load(self, registry: ModelRegistry, version: str, sha: str) -> ServedVersion:
        try:
            path = registry.local_artifact(sha + ONNX_SUFFIX)
        except FileNotFoundError:
            raise BackendFileError(
                f"version {version} has no ONNX back-end in the store (the replica that published it"
                " could not write one): serve it from a replica on the torch runtime"
            ) from None
        loaded = read_onnx_backend(path, self.threads)
        return ServedVersion(
            version,
            sha,
            loaded.slot_table,
            loaded.num_classes,
            loaded.interface_shape,
            loaded.forward,
            self.name,
        )

    def write_version(self, scratch: Path, model: ServedVersion) -> tuple[Path, Path]:
        raise RuntimeChoiceError("the onnx runtime publishes no version: alignment rounds need torch")

    def write_onnx(self, pt_file: Path, onnx_file: Path, model: ServedVersion) -> bool:
        return False
