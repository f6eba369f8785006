"""Reading an ONNX back-end file, for both runtimes: server/services/runtimes.py (which imports no torch) and
server/services/torch_runtime.py (which server/services/runtimes.py imports only when the torch runtime is chosen)."""

from __future__ import annotations

from pathlib import Path

from harmony_mobile.onnx_backend import OnnxBackendError, load_onnx_backend


class BackendFileError(ValueError):
    """A back-end file the chosen runtime cannot serve; the message is one line."""


def read_onnx_backend(path: Path, threads: int | None):
    try:
        return load_onnx_backend(Path(path).read_bytes(), threads)
    except OnnxBackendError as error:
        raise BackendFileError(f"{path}: {error}") from None
