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
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from harmony_mobile.server.store import Store, VersionRecord, utc_now

from harmony_mobile.models import Backend, ProjectionHead
from harmony_mobile.protocol.slots import SlotTable
from harmony_mobile.run_dir import load_backend_file, save_backend

ARTIFACTS_DIR = "artifacts"
BACKEND_IN_MODEL_DIR = Path("backend") / "backend.pt"
VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # fullmatch: the whole name


class UnknownVersion(LookupError):
    def __init__(self, version: str, known: list[str]):
        self.version = version
        super().__init__(f"no back-end version {version!r}; known: {', '.join(known) or 'none'}")


class NoParentVersion(LookupError):
    pass


@dataclass
class ServedModel:
    """One loaded back-end version. Read-only once built: inference threads share it."""

    version: str
    sha256: str
    backend: Backend
    projection: ProjectionHead
    class_names: tuple[str, ...]
    replay: torch.Tensor  # (N, *interface) float16, label-free features of training images; N may be 0
    slot_table: SlotTable  # label epoch + the token of each output of g the server serves

    @property
    def label_epoch(self) -> str:
        return self.slot_table.label_epoch

    @property
    def num_classes(self) -> int:
        return self.backend.num_classes

    @property
    def interface_shape(self) -> tuple[int, int, int]:
        return self.backend.interface.shape


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ModelRegistry:
    def __init__(self, store: Store, data_dir: Path):
        self.store = store
        self.artifacts = Path(data_dir) / ARTIFACTS_DIR
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._loaded: dict[str, ServedModel] = {}
        self._default: ServedModel | None = None

    # ---------------------------------------------------------------- startup

    def import_backend(self, source: Path) -> str | None:
        """Import <model-dir>/backend/backend.pt. A file never seen before becomes the default (a new
        export means a new training run); a known file changes nothing, so a restart keeps whatever
        alignment or an operator published since."""
        if not source.is_file():
            return None
        sha = sha256_file(source)
        known = self.store.version_by_sha256(sha)
        if known is not None:
            self._store_file(source, sha)  # another replica may have registered it first
            return known.version
        loaded = load_backend_file(source)  # validates the file before it enters the registry
        self._store_file(source, sha)
        name = loaded.model_version if VERSION_PATTERN.fullmatch(loaded.model_version) else "imported"
        metrics = {"source": str(source), "replay_rows": int(loaded.replay.shape[0])}
        # another process may have registered the same file since the look-up above
        return self.store.add_imported_version(VersionRecord(name, sha, None, "import", utc_now(), metrics))

    def load_default(self) -> ServedModel | None:
        name = self.store.default_version()
        if name is None:
            return None
        model = self.get(name)
        with self._lock:
            self._default = model
        return model

    # ---------------------------------------------------------------- reads

    def default(self) -> ServedModel | None:
        with self._lock:
            return self._default

    def loaded(self, version: str | None) -> ServedModel | None:
        """The model if it is already in memory (no disk or database access: safe on the event loop)."""
        with self._lock:
            return self._default if version is None else self._loaded.get(version)

    def resolve(self, version: str | None) -> ServedModel:
        if version is None:
            model = self.default()
            if model is None:
                raise UnknownVersion("(default)", self.version_names())
            return model
        return self.get(version)

    def get(self, version: str) -> ServedModel:
        with self._lock:
            if version in self._loaded:
                return self._loaded[version]
        record = self.store.version(version)
        if record is None:
            raise UnknownVersion(version, self.version_names())
        loaded = load_backend_file(self._local_artifact(record.sha256))
        model = ServedModel(
            version,
            record.sha256,
            loaded.backend,
            loaded.projection,
            loaded.class_names,
            loaded.replay,
            loaded.slot_table,
        )
        with self._lock:
            return self._loaded.setdefault(version, model)

    def version_names(self) -> list[str]:
        return [v.version for v in self.store.versions()]

    # ---------------------------------------------------------------- writes

    def publish(
        self,
        version: str,
        backend: Backend,
        projection: ProjectionHead,
        class_names: tuple[str, ...],
        parent: str,
        metrics: dict,
        replay: torch.Tensor,
        slot_table: SlotTable,
    ) -> ServedModel:
        backend, projection = backend.eval(), projection.eval()
        with tempfile.TemporaryDirectory(dir=self.artifacts) as scratch:
            scratch_file = Path(scratch) / "backend.pt"
            save_backend(scratch_file, backend, projection, version, class_names, slot_table, replay)
            sha = sha256_file(scratch_file)
            self._store_file(scratch_file, sha)
        self.store.add_version(
            VersionRecord(version, sha, parent, "alignment", utc_now(), metrics), make_default=True
        )
        model = ServedModel(
            version, sha, backend, projection, class_names, replay.to(torch.float16), slot_table.copy()
        )
        with self._lock:
            self._loaded[version] = model
            self._default = model
        return model

    def set_default(self, version: str) -> ServedModel:
        model = self.get(version)  # raises UnknownVersion
        self.store.set_default_version(version)
        with self._lock:
            self._default = model
        return model

    def rollback(self) -> ServedModel:
        current = self.store.default_version()
        record = self.store.version(current) if current else None
        if record is None or record.parent is None:
            raise NoParentVersion(f"the default version {current!r} has no parent to roll back to")
        return self.set_default(record.parent)

    def _local_artifact(self, sha: str) -> Path:
        """artifacts/<sha256>.pt, fetched from the store when another replica published it."""
        destination = self.artifacts / f"{sha}.pt"
        if not destination.exists():
            content = self.store.artifact(sha)
            if content is None:
                raise FileNotFoundError(
                    f"back-end file {sha} is neither in {self.artifacts} nor in the store"
                )
            with tempfile.TemporaryDirectory(dir=self.artifacts) as scratch:
                fetched = Path(scratch) / "fetched.pt"
                fetched.write_bytes(content)
                self._write_artifact(fetched, destination)
        return destination

    def _store_file(self, source: Path, sha: str) -> Path:
        """Keep a back-end file in the store (shared by replicas) and in artifacts/<sha256>.pt."""
        self.store.add_artifact(sha, source.read_bytes())
        destination = self.artifacts / f"{sha}.pt"
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


def predict(model: ServedModel, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Slot scores (N, S) over the S slots of the version's table, top slot and confidence (max
    softmax over those slots). The server answers in slots: only a phone knows their classes."""
    with torch.inference_mode():
        slot_scores = model.backend(features)[:, : len(model.slot_table)]
        if slot_scores.shape[1] == 0:  # a back-end that never saw a token has no slot to answer with
            empty = torch.zeros(features.shape[0])
            return slot_scores, torch.full((features.shape[0],), -1, dtype=torch.int64), empty
        confidence, top_slot = torch.softmax(slot_scores, dim=1).max(dim=1)
    return slot_scores, top_slot, confidence
