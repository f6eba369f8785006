"""`harmony export-app android|ios`: put a verified export where a demo app expects it.

What each app reads, and where this module writes it (paths relative to the repository root):

    android   android_demo/app/src/main/assets/export/   manifest.json, both signatures and keys, the
                                                         tiers' XNNPACK .pte files
              android_demo/harmony.properties            harmony.pinnedManifestKey (the P-256 key,
                                                         signing_key_p256.pub) and harmony.serverUrl
              android_demo/app/src/main/assets/provisioning.local.json   the run's federation secret
    ios       ios_demo/HarmonyDemo/Export/               manifest.json, both signatures and keys, the
                                                         tiers' Core ML packages and .pte files
              ios_demo/HarmonyDemo/HarmonyDemo/Resources/pinned_signing_key.pub   (Ed25519)
              ios_demo/HarmonyDemo/HarmonyDemo/Resources/server_url.txt
              ios_demo/HarmonyDemo/HarmonyDemo/Resources/provisioning.local.json

The export is verified first (signatures and every file's digest), so an app never gets a copy
that would fail its own check. The federation secret comes from the training run (`federation_secret`
in the run directory): a phone needs it to token its labels and to decode the server's slots. It goes
to `provisioning.local.json` (owner-only, git-ignored), never into the tracked `provisioning.json`,
which holds a placeholder secret the apps fall back to so that a fresh checkout builds: a secret
must not end up in a commit.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from harmony_mobile.export.keys import P256_PUBLIC_KEY_FILE, PUBLIC_KEY_FILE
from harmony_mobile.export.manifest import (
    MANIFEST_FILE,
    P256_SIGNATURE_FILE,
    SIGNATURE_FILE,
    Manifest,
    verify_manifest,
)

Platform = Literal["android", "ios"]
PLATFORMS: tuple[str, ...] = ("android", "ios")
SECRET_FILE = "clients/federation_secret"  # in a run directory: its client part (harmony_mobile/run_dir.py)
LOCAL_PROVISIONING_FILE = "provisioning.local.json"  # git-ignored; the apps prefer it to provisioning.json
DEFAULT_SERVER_URLS = {
    # the host machine as the Android emulator and the iOS simulator see it
    "android": "http://10.0.2.2:8000",
    "ios": "http://localhost:8000",
}
# Which artifacts each app can load.
APP_BACKENDS = {"android": {"xnnpack"}, "ios": {"xnnpack", "coreml"}}
TRUST_FILES = (MANIFEST_FILE, SIGNATURE_FILE, PUBLIC_KEY_FILE, P256_SIGNATURE_FILE, P256_PUBLIC_KEY_FILE)


class ExportAppError(ValueError):
    """The export, run or repository cannot produce a working app bundle; says what to do."""


@dataclass
class AppInstall:
    platform: str
    export_dir: Path
    model_version: str
    copied: list[str] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)
    server_url: str = ""
    provisioned: bool = False


def find_repository(start: Path | None = None) -> Path:
    """The checkout holding android_demo/ and ios_demo/ (from `start` or the working directory up)."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "android_demo").is_dir() and (candidate / "ios_demo").is_dir():
            return candidate
    raise ExportAppError(
        f"no android_demo/ and ios_demo/ above {here}: run from the repository or pass --repo"
    )


def default_run_dir(export_dir: Path) -> Path | None:
    """`make demo` writes demo-output/export beside demo-output/run."""
    sibling = export_dir.parent / "run"
    return sibling if (sibling / SECRET_FILE).is_file() else None


def install(
    platform: str,
    export_dir: Path,
    repo: Path,
    *,
    server_url: str | None = None,
    run_dir: Path | None = None,
) -> AppInstall:
    """Verify `export_dir` and copy it, its pinned key, a server URL and the run's secret into the app."""
    if platform not in PLATFORMS:
        raise ExportAppError(f"platform must be one of {', '.join(PLATFORMS)}, got {platform!r}")
    export_dir = Path(export_dir)
    manifest = verify_manifest(export_dir)  # ManifestError names every problem
    key_file = P256_PUBLIC_KEY_FILE if platform == "android" else PUBLIC_KEY_FILE
    if platform == "android" and manifest.signature.p256 is None:
        raise ExportAppError(
            f"{export_dir} has no ECDSA P-256 signature ({P256_SIGNATURE_FILE}), which the Android app "
            "verifies; re-export it with this version of `harmony export`"
        )
    result = AppInstall(platform, export_dir, manifest.model_version)
    result.server_url = _check_url(server_url or DEFAULT_SERVER_URLS[platform])
    pinned_key = (export_dir / key_file).read_text(encoding="ascii").strip()
    if platform == "android":
        _install_android(result, manifest, repo, pinned_key)
    else:
        _install_ios(result, manifest, repo, pinned_key)
    secret = _federation_secret(run_dir if run_dir is not None else default_run_dir(export_dir))
    if secret is not None:
        result.written.append(_write_provisioning(repo, platform, secret))
        result.provisioned = True
    return result


def _check_url(url: str) -> str:
    if not url.startswith(("http://", "https://")) or any(c in url for c in " \n\"'\\"):
        raise ExportAppError(f"--server-url must be an http(s) URL without spaces or quotes, got {url!r}")
    return url.rstrip("/")


def _artifacts(manifest: Manifest, platform: str) -> list[str]:
    backends = APP_BACKENDS[platform]
    return sorted({a.path for t in manifest.tiers for a in t.artifacts if a.backend in backends})


def _copy_export(result: AppInstall, manifest: Manifest, target: Path, keep: tuple[str, ...] = ()) -> None:
    """Replace `target`'s content (except `keep`) with the trust files and the app's artifacts."""
    target.mkdir(parents=True, exist_ok=True)
    for child in target.iterdir():
        if child.name in keep:
            continue
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    for relpath in [name for name in TRUST_FILES if (result.export_dir / name).is_file()] + _artifacts(
        manifest, result.platform
    ):
        source, destination = result.export_dir / relpath, target / relpath
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():  # a Core ML .mlpackage
            shutil.copytree(source, destination)
        else:
            shutil.copy2(source, destination)
        result.copied.append(relpath)


def _install_android(result: AppInstall, manifest: Manifest, repo: Path, pinned_key: str) -> None:
    android = repo / "android_demo"
    _copy_export(result, manifest, android / "app" / "src" / "main" / "assets" / "export")
    properties = android / "harmony.properties"
    properties.write_text(
        "# Written by `harmony export-app android`; read by app/build.gradle.kts (overrides gradle.properties).\n"
        f"harmony.pinnedManifestKey={pinned_key}\n"
        f"harmony.serverUrl={result.server_url}\n",
        encoding="utf-8",
    )
    result.written.append(properties)


def _install_ios(result: AppInstall, manifest: Manifest, repo: Path, pinned_key: str) -> None:
    app = repo / "ios_demo" / "HarmonyDemo"
    _copy_export(result, manifest, app / "Export", keep=("README.md",))
    resources = app / "HarmonyDemo" / "Resources"
    (resources / "pinned_signing_key.pub").write_text(pinned_key, encoding="ascii")
    (resources / "server_url.txt").write_text(result.server_url + "\n", encoding="utf-8")
    result.written += [resources / "pinned_signing_key.pub", resources / "server_url.txt"]


def _federation_secret(run_dir: Path | None) -> bytes | None:
    if run_dir is None:
        return None
    path = Path(run_dir) / SECRET_FILE
    if not path.is_file():
        raise ExportAppError(
            f"{run_dir} has no {SECRET_FILE}: phones need the run's federation secret to decode slots"
        )
    secret = path.read_bytes()
    if len(secret) < 16:
        raise ExportAppError(f"{path} holds {len(secret)} bytes; a federation secret has at least 16")
    return secret


def _write_provisioning(repo: Path, platform: str, secret: bytes) -> Path:
    folder = (
        repo / "android_demo" / "app" / "src" / "main" / "assets"
        if platform == "android"
        else repo / "ios_demo" / "HarmonyDemo" / "HarmonyDemo" / "Resources"
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCAL_PROVISIONING_FILE
    document = {
        "comment": "Written by `harmony export-app` from the exported run; git-ignored. The app prefers "
        "this file to provisioning.json (a placeholder). A real fleet provisions the secret through "
        "MDM / managed app configuration (docs/PROTOCOL.md section 2).",
        "federation_secret_hex": secret.hex(),
    }
    # owner-only from the first byte: the secret decodes every phone's labels
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # an older file may have been created with wider permissions
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return path
