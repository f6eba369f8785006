"""Back-end versions: content-addressed files on disk, their records in the store, the served one in memory.

Publishing order (atomic for readers, safe on crash):
  1. write the state dicts to a temporary file in artifacts/, fsync it, rename it to <sha256>.pt,
     fsync the directory (the file is now durable under its content address);
  2. insert the version record and the new default in one SQLite transaction (the commit point);
  3. swap the in-memory default under a lock.
A crash before 2 leaves an unreferenced file and the old default; after 2 the next start serves
the new version. In-flight requests keep the model object they resolved, so a swap never mixes
versions inside one request. Every file carries its lineage's replay set (run_dir.save_backend):
a published version inherits its parent's unchanged, so uploaded features never leave their
sealed envelopes.

Two runtimes serve a version (server/services/runtimes.py): PyTorch loads <sha256>.pt; ONNX Runtime, on a
replica installed without torch, loads the version's ONNX back-end <sha256>.onnx, which export and
every publish write beside it (harmony_mobile/onnx_backend.py). This module imports no torch.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from harmony_mobile.server.services.store import Store, VersionRecord, utc_now

from harmony_mobile.protocol.digests import sha256_file

if TYPE_CHECKING:
    from harmony_mobile.server.services.runtimes import Runtime

ARTIFACTS_DIR = "artifacts"
BACKEND_IN_MODEL_DIR = Path("backend") / "backend.pt"
ONNX_IN_MODEL_DIR = Path("backend") / "backend.onnx"
ONNX_SUFFIX = ".onnx"  # store key and file name of a version's ONNX back-end: <sha256>.onnx
VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # fullmatch: the whole name


class UnknownVersion(LookupError):
    def __init__(self, version: str, known: list[str]):
        self.version = version
        super().__init__(f"no back-end version {version!r}; known: {', '.join(known) or 'none'}")


class NoParentVersion(LookupError):
    pass


@dataclass
class ServedVersion:
    """One loaded back-end version. Read-only once built: inference threads share it."""

    version: str
    sha256: str
    slot_table: Any  # protocol SlotTable (torch) or onnx_backend.ServedSlots: label epoch + tokens
    num_classes: int
    interface_shape: tuple[int, int, int]
    forward: Callable[[np.ndarray], np.ndarray]  # features (N, *interface) -> logits (N, num_classes)
    runtime: str  # "torch" or "onnx"
    # what alignment rounds train from: only the torch runtime loads them (None / () on "onnx")
    backend: Any = None
    projection: Any = None
    class_names: tuple[str, ...] = ()
    replay: Any = None  # (N, *interface) float16 torch tensor of label-free training features

    @property
    def label_epoch(self) -> str:
        return self.slot_table.label_epoch


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ModelRegistry:
    def __init__(self, store: Store, data_dir: Path, runtime: Runtime):
        self.store = store
        self.runtime = runtime
        self.artifacts = Path(data_dir) / ARTIFACTS_DIR
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._loaded: dict[str, ServedVersion] = {}
        self._default: ServedVersion | None = None

    # ---------------------------------------------------------------- startup

    def import_backend(self, model_dir: Path) -> str | None:
        """Import <model-dir>/backend/backend.pt (and its ONNX back-end, backend.onnx, when the
        export wrote one). A file never seen before becomes the default (a new export means a new
        training run); a known file changes nothing, so a restart keeps whatever alignment or an
        operator published since. The runtime validates what it will serve before anything is stored."""
        source, onnx_file = Path(model_dir) / BACKEND_IN_MODEL_DIR, Path(model_dir) / ONNX_IN_MODEL_DIR
        if not source.is_file():
            return None
        sha = sha256_file(source)
        known = self.store.version_by_sha256(sha)
        model_version, replay_rows = self.runtime.check_import(source, onnx_file, sha)
        if self.runtime.onnx_matches(onnx_file, sha):  # for replicas without torch
            self._store_file(onnx_file, sha + ONNX_SUFFIX)
        self._store_file(source, sha)  # another replica may have registered it first
        if known is not None:
            return known.version
        name = model_version if VERSION_PATTERN.fullmatch(model_version) else "imported"
        metrics = {"source": str(source), "replay_rows": replay_rows}
        # another process may have registered the same file since the look-up above
        return self.store.add_imported_version(VersionRecord(name, sha, None, "import", utc_now(), metrics))

    def load_default(self) -> ServedVersion | None:
        name = self.store.default_version()
        if name is None:
            return None
        model = self.get(name)
        with self._lock:
            self._default = model
        return model

    # ---------------------------------------------------------------- reads

    def default(self) -> ServedVersion | None:
        with self._lock:
            return self._default

    def loaded(self, version: str | None) -> ServedVersion | None:
        """The model if it is already in memory (no disk or database access: safe on the event loop)."""
        with self._lock:
            return self._default if version is None else self._loaded.get(version)

    def resolve(self, version: str | None) -> ServedVersion:
        if version is None:
            model = self.default()
            if model is None:
                raise UnknownVersion("(default)", self.version_names())
            return model
        return self.get(version)

    def get(self, version: str) -> ServedVersion:
        with self._lock:
            if version in self._loaded:
                return self._loaded[version]
        record = self.store.version(version)
        if record is None:
            raise UnknownVersion(version, self.version_names())
        model = self.runtime.load(self, version, record.sha256)
        with self._lock:
            return self._loaded.setdefault(version, model)

    def version_names(self) -> list[str]:
        return [v.version for v in self.store.versions()]

    # ---------------------------------------------------------------- writes

    def publish(self, version: str, parent: str, metrics: dict, model: ServedVersion) -> ServedVersion:
        """Store an alignment round's version (the torch runtime writes its files) and serve it."""
        with tempfile.TemporaryDirectory(dir=self.artifacts) as scratch:
            pt_file, onnx_file = self.runtime.write_version(Path(scratch), model)
            model.sha256 = sha = sha256_file(pt_file)
            if self.runtime.write_onnx(pt_file, onnx_file, model):
                self._store_file(onnx_file, sha + ONNX_SUFFIX)
            self._store_file(pt_file, sha)
        self.store.add_version(
            VersionRecord(version, sha, parent, "alignment", utc_now(), metrics), make_default=True
        )
        with self._lock:
            self._loaded[version] = model
            self._default = model
        return model

    def set_default(self, version: str) -> ServedVersion:
        model = self.get(version)  # raises UnknownVersion
        self.store.set_default_version(version)
        with self._lock:
            self._default = model
        return model

    def rollback(self) -> ServedVersion:
        current = self.store.default_version()
        record = self.store.version(current) if current else None
        if record is None or record.parent is None:
            raise NoParentVersion(f"the default version {current!r} has no parent to roll back to")
        return self.set_default(record.parent)

    def local_artifact(self, key: str) -> Path:
        """artifacts/<key> (key: <sha256> of a back-end file, stored as <sha256>.pt, or
        <sha256>.onnx), fetched from the store when another replica stored it."""
        destination = self.artifacts / (key if key.endswith(ONNX_SUFFIX) else f"{key}.pt")
        if not destination.exists():
            content = self.store.artifact(key)
            if content is None:
                raise FileNotFoundError(
                    f"back-end file {key} is neither in {self.artifacts} nor in the store"
                )
            with tempfile.TemporaryDirectory(dir=self.artifacts) as scratch:
                fetched = Path(scratch) / "fetched"
                fetched.write_bytes(content)
                self._write_artifact(fetched, destination)
        return destination

    def _store_file(self, source: Path, key: str) -> Path:
        """Keep a back-end file in the store (shared by replicas) and in artifacts/."""
        self.store.add_artifact(key, source.read_bytes())
        destination = self.artifacts / (key if key.endswith(ONNX_SUFFIX) else f"{key}.pt")
        if not destination.exists():
            self._write_artifact(source, destination)
        return destination

    def _write_artifact(self, source: Path, destination: Path) -> None:
        """Copy durably: temp file, fsync, rename, fsync the directory."""
        fd, temp = tempfile.mkstemp(dir=self.artifacts, suffix=".partial")
        try:
            with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
                shutil.copyfileobj(src, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, destination)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        _fsync_dir(self.artifacts)


def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def predict(model: ServedVersion, features: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Slot scores (N, S) float32 over the S slots of the version's table, top slot (int64) and
    confidence (max softmax over those slots, float32). The server answers in slots: only a phone
    knows their classes. Same arithmetic for both runtimes: only g's forward differs."""
    slot_scores = np.ascontiguousarray(model.forward(features)[:, : len(model.slot_table)], np.float32)
    rows = features.shape[0]
    if slot_scores.shape[1] == 0:  # a back-end that never saw a token has no slot to answer with
        return slot_scores, np.full(rows, -1, np.int64), np.zeros(rows, np.float32)
    probabilities = _softmax(slot_scores.astype(np.float64))
    top_slot = probabilities.argmax(axis=1).astype(np.int64)
    confidence = probabilities[np.arange(rows), top_slot].astype(np.float32)
    return slot_scores, top_slot, confidence
