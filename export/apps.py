"""`harmony export-app android|ios`: put a verified export where a demo app expects it.

What each app reads, and where this module writes it (paths relative to the repository root):

    android   android_demo/app/src/main/assets/export/   manifest.json, both signatures and keys, the
                                                         tiers' XNNPACK .pte files
              android_demo/harmony.properties            harmony.pinnedManifestKey (the P-256 key
                                                         the app pins) and harmony.serverUrl
    ios       ios_demo/HarmonyDemo/Export/               manifest.json, both signatures and keys, the
                                                         tiers' Core ML packages and .pte files
              ios_demo/HarmonyDemo/HarmonyDemo/Resources/pinned_signing_key.pub   (Ed25519)
              ios_demo/HarmonyDemo/HarmonyDemo/Resources/server_url.txt

The pinned key is the one you pass (`--pinned-key`, the platform's public key file from your key
directory) or the one the app already pins, never the export's own: an export re-signed with
another key is refused, because whoever can replace an export can replace the key file beside it.
The export is verified against that key first (signature and every file's digest).

The federation secret is never written into an app (anything under assets/ or Resources/ is
packaged, and anyone who unzips the app could decode every phone's labels): export-app refuses to
run without the run's secret, checks that it is the secret of this export (its class tokens are
the manifest's slot table), removes any provisioning file an older version left in the app, and
writes the provisioning payload (export/provisioning.py) owner-only to a path outside the app
trees, for `harmony provision`-style delivery to the phone (QR code, deep link, managed config).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from harmony_mobile.export.keys import (
    P256_PUBLIC_KEY_FILE,
    PUBLIC_KEY_FILE,
    SigningKeyError,
    decode_p256_public_key,
    decode_public_key,
    encode_p256_public_key,
    encode_public_key,
)
from harmony_mobile.export.manifest import (
    MANIFEST_FILE,
    P256_SIGNATURE_FILE,
    SIGNATURE_FILE,
    Manifest,
    verify_manifest,
)
from harmony_mobile.export.provisioning import (
    Provisioning,
    ProvisioningError,
    own_classes_of_export,
    payload_uri,
    write_payload,
)

from harmony_mobile.protocol.label_tokens import class_tokens, epoch_key

Platform = Literal["android", "ios"]
PLATFORMS: tuple[str, ...] = ("android", "ios")
SECRET_FILE = "clients/federation_secret"  # in a run directory: its client part (harmony_mobile/run_dir.py)
# Provisioning files older versions wrote into the apps (which packaged them): removed on sight.
STALE_PROVISIONING_FILES = ("provisioning.local.json", "provisioning.json")
PAYLOAD_FILE = "provisioning-{platform}.txt"  # beside the export directory, outside the app trees
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
    removed: list[Path] = field(default_factory=list)
    server_url: str = ""
    payload: Path | None = None  # the provisioning payload, outside the app


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
    pinned_key: Path | None = None,
    payload_out: Path | None = None,
) -> AppInstall:
    """Verify `export_dir` against the pinned key and copy it, that key and a server URL into the app;
    write the run's provisioning payload to `payload_out` (default: beside the export), never into
    the app."""
    if platform not in PLATFORMS:
        raise ExportAppError(f"platform must be one of {', '.join(PLATFORMS)}, got {platform!r}")
    export_dir = Path(export_dir)
    run_dir = run_dir if run_dir is not None else default_run_dir(export_dir)
    secret = _federation_secret(run_dir, export_dir)
    key_text = _pinned_key_text(platform, repo, pinned_key)
    if platform == "android":
        manifest = verify_manifest(export_dir, p256_public_key=key_text)  # ManifestError names every problem
        if manifest.signature.p256 is None:
            raise ExportAppError(
                f"{export_dir} has no ECDSA P-256 signature ({P256_SIGNATURE_FILE}), which the Android app "
                "verifies; re-export it with this version of `harmony export`"
            )
    else:
        manifest = verify_manifest(export_dir, public_key=key_text)
    _check_secret_matches(manifest, secret)
    result = AppInstall(platform, export_dir, manifest.model_version)
    result.server_url = _check_url(server_url or DEFAULT_SERVER_URLS[platform])
    if platform == "android":
        _install_android(result, manifest, repo, key_text)
    else:
        _install_ios(result, manifest, repo, key_text)
    result.removed = _remove_stale_provisioning(repo)
    payload = payload_uri(
        Provisioning(secret, result.server_url, own_classes=_own_classes(manifest, run_dir, export_dir))
    )
    target = (
        payload_out if payload_out is not None else export_dir.parent / PAYLOAD_FILE.format(platform=platform)
    )
    result.payload = write_payload(target, payload, app_roots(repo))
    return result


def _own_classes(manifest: Manifest, run_dir: Path, export_dir: Path) -> dict[str, tuple[str, ...]] | None:
    """A slot-gated tier gates by the classes its phone holds: the demo apps, which install a front-end
    personalized elsewhere, learn them from the payload (none needed when every tier exits by max softmax)."""
    if all(tier.exit_rule == "max_softmax" for tier in manifest.tiers):
        return None
    from harmony_mobile.run_dir import RunDir, RunDirError  # torch: only for slot-gated exports

    try:
        return own_classes_of_export(RunDir(run_dir), manifest, export_dir)
    except (ProvisioningError, RunDirError) as error:
        raise ExportAppError(f"the payload cannot name each tier's own classes: {error}") from None


def app_roots(repo: Path) -> list[Path]:
    """The folders whose content ends up in an app: nothing secret may be written under them."""
    return [repo / "android_demo", repo / "ios_demo"]


def _pinned_key_text(platform: str, repo: Path, pinned_key: Path | None) -> str:
    """The key the app pins: the file passed, else the one the app already pins; never the export's."""
    file_name = P256_PUBLIC_KEY_FILE if platform == "android" else PUBLIC_KEY_FILE
    if pinned_key is not None:
        try:
            text = Path(pinned_key).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise ExportAppError(f"cannot read --pinned-key {pinned_key}: {error}") from None
    else:
        text = _app_pinned_key(platform, repo)
        if not text:
            raise ExportAppError(
                f"the {platform} app pins no manifest key yet: pass --pinned-key with the {file_name} "
                "of the key directory that signs your exports (`harmony export --key-dir`, default "
                "~/.config/harmony-mobile/keys)"
            )
    try:  # normalized, so a stray newline or a wrong kind of key is caught here, not on the phone
        if platform == "android":
            return encode_p256_public_key(
                decode_p256_public_key(text, str(pinned_key or "pinned key"))
            ).decode()
        return encode_public_key(decode_public_key(text, str(pinned_key or "pinned key"))).decode()
    except SigningKeyError as error:
        raise ExportAppError(f"{error} (the {platform} app pins a {file_name} key)") from None


def _app_pinned_key(platform: str, repo: Path) -> str:
    if platform == "android":
        properties = repo / "android_demo" / "harmony.properties"
        lines = properties.read_text(encoding="utf-8").splitlines() if properties.is_file() else []
        values = [line.split("=", 1)[1] for line in lines if line.startswith("harmony.pinnedManifestKey=")]
        return values[-1].strip() if values else ""
    key_file = repo / "ios_demo" / "HarmonyDemo" / "HarmonyDemo" / "Resources" / "pinned_signing_key.pub"
    return key_file.read_text(encoding="ascii").strip() if key_file.is_file() else ""


def _check_url(url: str) -> str:
    if not url.startswith(("http://", "https://")) or any(c in url for c in " \n\"'\\"):
        raise ExportAppError(f"--server-url must be an http(s) URL without spaces or quotes, got {url!r}")
    return url.rstrip("/")


def _artifacts(manifest: Manifest, platform: str) -> list[str]:
    """The tier artifacts the app can load, each tier's personalization programs (XNNPACK .pte files
    the app trains and answers with on device) where the app runs XNNPACK, and the slot prototypes
    a slot-gated tier installs with its artifact."""
    backends = APP_BACKENDS[platform]
    paths = {a.path for t in manifest.tiers for a in t.artifacts if a.backend in backends}
    if "xnnpack" in backends:
        paths |= {p.path for t in manifest.tiers if t.personalization for p in t.personalization.programs()}
    if manifest.slot_prototypes is not None:
        paths.add(manifest.slot_prototypes.path)
    return sorted(paths)


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


def _federation_secret(run_dir: Path | None, export_dir: Path) -> bytes:
    if run_dir is None:
        raise ExportAppError(
            f"no training run beside {export_dir} (pass --run RUN_DIR): phones need the run's federation "
            "secret, provisioned at run time, to token labels and decode slots; without it the app "
            "would decode nothing"
        )
    path = Path(run_dir) / SECRET_FILE
    if not path.is_file():
        raise ExportAppError(
            f"{run_dir} has no {SECRET_FILE}: phones need the run's federation secret to decode slots"
        )
    secret = path.read_bytes()
    if len(secret) < 16:
        raise ExportAppError(f"{path} holds {len(secret)} bytes; a federation secret has at least 16")
    return secret


def _check_secret_matches(manifest: Manifest, secret: bytes) -> None:
    """The secret's class tokens under the manifest's label epoch must be its back-end's slot table."""
    tokens = {t.hex() for t in class_tokens(epoch_key(secret, manifest.label_epoch), manifest.class_names)}
    if tokens != set(manifest.slot_table):
        raise ExportAppError(
            "the run's federation secret is not this export's: its class tokens are not the manifest's "
            "slot table (pass --run with the run the export was made from)"
        )


def _remove_stale_provisioning(repo: Path) -> list[Path]:
    """Delete provisioning files that older versions put into the apps (they would be packaged)."""
    folders = [
        repo / "android_demo" / "app" / "src" / "main" / "assets",
        repo / "ios_demo" / "HarmonyDemo" / "HarmonyDemo" / "Resources",
    ]
    removed = []
    for path in (folder / name for folder in folders for name in STALE_PROVISIONING_FILES):
        if path.is_file():
            path.unlink()
            removed.append(path)
    return removed
