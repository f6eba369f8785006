"""A phone's installed model and its updates: newer signed manifests only, switched atomically.

Layout under the store's root (the app's private storage):

    current.json            {"manifest_version", "manifest_sha256", "directory"}: the model in use,
                            replaced by an atomic rename, so a reader sees the old model or the new one
    versions/<version>/     manifest.json, manifest.sig and the artifacts it installed, verified
    .staging-*/             an update being downloaded (removed when it fails)

An update is the server's manifest (GET /v1/manifest and /v1/manifest.sig, PROTOCOL.md 2.3) and its
artifacts (`fetch_artifact` gets a manifest path's bytes; by default `fetch_server_artifact`, from the
server's GET /v1/artifacts/{path}, PROTOCOL.md 2.4).
It is installed only when its signature verifies under the pinned key, its manifest_version is
higher than the installed one (manifest.is_update: an older or reused version is a rollback and
refused) and every artifact matches its sha256 and size. Counterparts: harmony-core
`org.harmonymobile.core.update.ModelStore`, HarmonyKit `Update/ModelStore.swift`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from harmony_mobile.device.errors import DeviceError
from harmony_mobile.device.manifest import (
    MANIFEST_FILE,
    SIGNATURE_FILE,
    is_update,
    manifest_version,
    phone_files,
    read_verified_artifact,
    verify_manifest_bytes,
)

CURRENT_FILE = "current.json"
VERSIONS_DIR = "versions"
# the default artifact base URL, relative to the server's (harmony-core and HarmonyKit use the same)
ARTIFACTS_PATH = "/v1/artifacts"


@dataclass(frozen=True)
class InstalledModel:
    manifest: dict
    directory: Path
    manifest_version: int
    manifest_sha256: str


class ModelStore:
    """The installed model of one phone (one tier), verified under the pinned key."""

    def __init__(self, root: str | Path, pinned_key: Ed25519PublicKey, tier: str):
        self.root = Path(root)
        self.pinned_key = pinned_key
        self.tier = tier

    def installed_version(self) -> tuple[int, str] | None:
        """(manifest_version, manifest sha256) of the model in use, from current.json alone: the
        mark an update must pass even when the installed files are damaged."""
        try:
            pointer = json.loads((self.root / CURRENT_FILE).read_text(encoding="utf-8"))
            return int(pointer["manifest_version"]), str(pointer["manifest_sha256"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DeviceError(f"the installed model's pointer {CURRENT_FILE} is damaged: {error}") from None

    def current(self) -> InstalledModel | None:
        """The model in use, re-verified (signature, then its files' digests), or None."""
        if self.installed_version() is None:
            return None
        pointer = json.loads((self.root / CURRENT_FILE).read_text(encoding="utf-8"))
        directory = self.root / pointer["directory"]
        data = (directory / MANIFEST_FILE).read_bytes()
        manifest = verify_manifest_bytes(data, (directory / SIGNATURE_FILE).read_bytes(), self.pinned_key)
        sha256 = hashlib.sha256(data).hexdigest()
        if sha256 != pointer["manifest_sha256"] or manifest_version(manifest) != pointer["manifest_version"]:
            raise DeviceError("the installed manifest is not the one current.json names")
        for file in phone_files(manifest, self.tier):
            read_verified_artifact(directory, file)
        return InstalledModel(manifest, directory, pointer["manifest_version"], sha256)

    def install(
        self, manifest_bytes: bytes, signature: bytes, fetch_artifact: Callable[[str], bytes]
    ) -> InstalledModel | None:
        """Install a signed manifest and this tier's files (`phone_files`) if it is an update; None when it
        is the installed one. Raises DeviceError (RollbackError for an older one) and leaves the
        installed model as it was."""
        candidate = verify_manifest_bytes(manifest_bytes, signature, self.pinned_key)
        if not is_update(self.installed_version(), candidate, manifest_bytes):
            return None
        files = phone_files(candidate, self.tier)
        for file in files:
            if Path(file["path"]).is_absolute() or ".." in Path(file["path"]).parts:
                raise DeviceError(f"unsafe artifact path in the manifest: {file['path']!r}")
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.root))
        try:
            _write(staging / MANIFEST_FILE, manifest_bytes)
            _write(staging / SIGNATURE_FILE, signature)
            for file in files:
                _write(staging / file["path"], fetch_artifact(file["path"]))
                read_verified_artifact(staging, file)  # sha256 and size against the signed manifest
            version = manifest_version(candidate)
            target = self.root / VERSIONS_DIR / str(version)
            target.parent.mkdir(exist_ok=True)
            shutil.rmtree(target, ignore_errors=True)  # a half-installed copy of this same version
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        sha256 = hashlib.sha256(manifest_bytes).hexdigest()
        self._switch(version, sha256, target)
        self._remove_other_versions(target)
        return InstalledModel(candidate, target, version, sha256)

    def _switch(self, version: int, sha256: str, target: Path) -> None:
        """Point current.json at `target` with one atomic rename (after the data is on disk)."""
        pointer = {
            "manifest_version": version,
            "manifest_sha256": sha256,
            "directory": target.relative_to(self.root).as_posix(),
        }
        temporary = self.root / f".{CURRENT_FILE}.tmp"
        _write(temporary, json.dumps(pointer).encode("utf-8"))
        os.replace(temporary, self.root / CURRENT_FILE)

    def _remove_other_versions(self, keep: Path) -> None:
        for directory in (self.root / VERSIONS_DIR).iterdir():
            if directory != keep:
                shutil.rmtree(directory, ignore_errors=True)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def fetch_signed_manifest(http, token: str) -> tuple[bytes, bytes]:
    """(manifest.json bytes, manifest.sig) from the server (an httpx.Client on its base URL)."""
    headers = {"Authorization": f"Bearer {token}"}
    responses = [http.get(path, headers=headers) for path in ("/v1/manifest", "/v1/manifest.sig")]
    for response in responses:
        if response.status_code != 200:
            raise DeviceError(
                f"GET {response.request.url.path}: {response.status_code} {response.text[:200]}"
            )
    return responses[0].content, responses[1].content


def fetch_server_artifact(http, token: str) -> Callable[[str], bytes]:
    """A `fetch_artifact` for ModelStore.install: a manifest path's bytes from the server's
    GET /v1/artifacts/{path} (an httpx.Client on its base URL). The store checks them against the
    signed manifest; the server is not trusted for them."""
    headers = {"Authorization": f"Bearer {token}"}

    def fetch(path: str) -> bytes:
        response = http.get(f"{ARTIFACTS_PATH}/{quote(path)}", headers=headers)
        if response.status_code != 200:
            raise DeviceError(f"GET {ARTIFACTS_PATH}/{path}: {response.status_code} {response.text[:200]}")
        return response.content

    return fetch
