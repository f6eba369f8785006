"""Digests of files as manifests and model registries state them: lowercase hex sha256."""

from __future__ import annotations

import hashlib
from pathlib import Path

BLOCK_BYTES = 1 << 20  # streamed: a model artifact need not fit in memory twice


def sha256_file(path: str | Path) -> str:
    """Lowercase hex sha256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()
