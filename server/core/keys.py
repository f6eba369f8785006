"""The server's X25519 key (uploads are sealed to it) and the admin token, both kept in the data dir."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from harmony_mobile.protocol.sealing import private_key_bytes

SERVER_KEY_FILE = "server_key.x25519"
ADMIN_TOKEN_FILE = "admin_token"


def _create_secret_file(path: Path, content: bytes) -> None:
    """Create a file readable by the owner only, whole or not at all: the content is written and
    synced under a temporary name, then linked to `path` (FileExistsError if another process created
    it first). A process starting beside it never reads a created but still empty file."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.link(temporary, path)
    finally:
        os.unlink(temporary)


def load_or_create_server_key(data_dir: Path) -> X25519PrivateKey:
    """Generated on first start; never rotated silently, since devices pin the public key."""
    path = Path(data_dir) / SERVER_KEY_FILE
    if not path.exists():
        try:
            _create_secret_file(path, private_key_bytes(X25519PrivateKey.generate()))
        except FileExistsError:
            pass  # another process created it first; use theirs
    raw = path.read_bytes()
    if len(raw) != 32:
        raise ValueError(f"{path} is {len(raw)} bytes; an X25519 private key is 32 raw bytes")
    return X25519PrivateKey.from_private_bytes(raw)


def load_or_create_admin_token(data_dir: Path) -> str:
    path = Path(data_dir) / ADMIN_TOKEN_FILE
    if not path.exists():
        try:
            _create_secret_file(path, secrets.token_urlsafe(32).encode())
        except FileExistsError:
            pass
    return path.read_text().strip()
