"""The durable upload queue: sealed request bodies on disk until the server acknowledges them.

Counterparts: harmony-core `org.harmonymobile.core.queue` (UploadQueue, PendingUpload,
QueueFullException); HarmonyKit `Queue/UploadQueue.swift`.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from harmony_mobile.device.errors import DeviceError

# matched with fullmatch: `$` of re.match would also accept a trailing newline
_ENTRY = re.compile(r"(\d{19})-([0-9a-f-]{36})\.upload")


class QueueFullError(DeviceError):
    """The upload queue is at its bound; the new upload was refused (nothing accepted is ever dropped)."""


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
        self._next = (int(_ENTRY.fullmatch(entries[-1].name).group(1)) + 1) if entries else 1

    def _entry_files(self) -> list[Path]:
        return sorted(p for p in self.directory.iterdir() if _ENTRY.fullmatch(p.name))

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
            match = _ENTRY.fullmatch(path.name)
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
