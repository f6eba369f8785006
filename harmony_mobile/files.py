"""Owner-only files: everything that holds features, model weights, secrets or keys is written
with mode 0600 inside directories of mode 0700, from the first byte (docs/PRIVACY.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def private_dir(path: Path) -> Path:
    """A directory (and its missing parents) only its owner can enter."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)  # mkdir's mode is filtered by the umask, and an existing dir keeps its own
    return path


def open_private(path: Path, mode: str = "wb", exclusive: bool = False):
    """A file opened for writing with mode 0600 from its first byte (its folder made private)."""
    private_dir(Path(path).parent)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    if "a" in mode:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    descriptor = os.open(path, flags, 0o600)
    os.fchmod(descriptor, 0o600)  # a file made earlier with wider permissions
    return os.fdopen(descriptor, mode)


def save_private(obj: Any, path: Path) -> None:
    """torch.save into an owner-only file."""
    import torch  # the server's data-dir code uses this module without needing torch here

    with open_private(path) as out:
        torch.save(obj, out)
