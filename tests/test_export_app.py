"""`harmony export-app android|ios`: a verified export, its pinned key, the server URL and the run's
federation secret land where each demo app reads them, and the copy passes the app's own checks."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from harmony_mobile.export.apps import ExportAppError, find_repository, install
from harmony_mobile.export.keys import decode_p256_public_key, decode_public_key
from harmony_mobile.export.manifest import (
    MANIFEST_FILE,
    P256_SIGNATURE_FILE,
    SIGNATURE_FILE,
    ManifestError,
    path_digest,
    read_manifest,
    signature_info,
    write_signed_manifest,
)
from typer.testing import CliRunner

from harmony_mobile.cli import app
from harmony_mobile.run_dir import write_federation_secret
from tests.export_fixtures import fake_export_dir

ROOT = Path(__file__).resolve().parents[1]
SECRET = bytes(range(7, 39))
ANDROID_ASSETS = Path("android_demo/app/src/main/assets")
IOS_APP = Path("ios_demo/HarmonyDemo")


@pytest.fixture
def repo(tmp_path) -> Path:
    """The parts of a checkout that export-app reads or writes."""
    repo = tmp_path / "repo"
    for relpath in (
        ANDROID_ASSETS / "provisioning.json",
        IOS_APP / "HarmonyDemo" / "Resources" / "provisioning.json",
        IOS_APP / "Export" / "README.md",
    ):
        (repo / relpath).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relpath, repo / relpath)
    return repo


@pytest.fixture
def export(tmp_path) -> Path:
    """demo-output layout: export/ beside run/ (which holds the run's federation secret)."""
    out = fake_export_dir(tmp_path / "demo-output" / "export", tmp_path / "keys")
    (tmp_path / "demo-output" / "run").mkdir()
    write_federation_secret(tmp_path / "demo-output" / "run", SECRET)  # where `harmony train` keeps it
    return out


def _assert_provisioned(repo: Path, folder: Path) -> None:
    """The run's secret lands in the owner-only, git-ignored local file; the tracked placeholder
    (which a commit would publish) stays byte for byte as the checkout has it."""
    local = repo / folder / "provisioning.local.json"
    assert json.loads(local.read_text())["federation_secret_hex"] == SECRET.hex()
    assert local.stat().st_mode & 0o777 == 0o600
    tracked = folder / "provisioning.json"
    assert (repo / tracked).read_bytes() == (ROOT / tracked).read_bytes()
    assert SECRET.hex() not in (repo / tracked).read_text()
    ignored = subprocess.run(["git", "check-ignore", "-q", str(folder / local.name)], cwd=ROOT, check=False)
    assert ignored.returncode == 0, f"{folder / local.name} is not git-ignored"


def _properties(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_android_gets_the_p256_pinned_export_and_its_own_artifacts_only(repo, export):
    stale = repo / ANDROID_ASSETS / "export" / "old-tier" / "front_int8.pte"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an older export")
    result = install("android", export, repo)

    target = repo / ANDROID_ASSETS / "export"
    assert not stale.exists(), "files of an older export are removed"
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*.pte")) == [
        "entry-android/front_fp32.pte",
        "entry-android/front_int8.pte",
    ]
    assert not list(target.rglob("*.mlpackage")), "Core ML packages are of no use to Android"
    # What ModelInstaller does: the P-256 signature over the exact bytes with the pinned key ...
    settings = _properties(repo / "android_demo" / "harmony.properties")
    assert settings["harmony.serverUrl"] == "http://10.0.2.2:8000"
    pinned = decode_p256_public_key(settings["harmony.pinnedManifestKey"])
    signature = base64.b64decode((target / P256_SIGNATURE_FILE).read_bytes())
    pinned.verify(signature, (target / MANIFEST_FILE).read_bytes(), ec.ECDSA(hashes.SHA256()))
    # ... then sha256 and size of the artifact it loads.
    manifest = read_manifest(target)
    for artifact in manifest.tier("entry-android").artifacts:
        assert path_digest(target / artifact.path) == (artifact.sha256, artifact.size)
    _assert_provisioned(repo, ANDROID_ASSETS)
    assert result.provisioned


def test_ios_gets_the_ed25519_pinned_export_with_core_ml_packages(repo, export):
    result = install("ios", export, repo, server_url="http://192.168.1.20:8000/")
    target = repo / IOS_APP / "Export"
    assert (target / "README.md").read_bytes() == (ROOT / IOS_APP / "Export" / "README.md").read_bytes()
    package = target / "mid-ios" / "front_coreml-fp16.mlpackage"
    manifest = read_manifest(target)
    coreml = manifest.tier("mid-ios").artifacts[0]
    assert package.is_dir() and path_digest(package) == (coreml.sha256, coreml.size)
    resources = repo / IOS_APP / "HarmonyDemo" / "Resources"
    pinned = decode_public_key((resources / "pinned_signing_key.pub").read_text())
    pinned.verify(
        base64.b64decode((target / SIGNATURE_FILE).read_bytes()), (target / MANIFEST_FILE).read_bytes()
    )
    assert (resources / "server_url.txt").read_text() == "http://192.168.1.20:8000\n"
    _assert_provisioned(repo, IOS_APP / "HarmonyDemo" / "Resources")
    assert result.server_url == "http://192.168.1.20:8000"


def test_a_tampered_export_is_refused_before_anything_is_copied(repo, export):
    (export / "entry-android" / "front_int8.pte").write_bytes(b"tampered")
    with pytest.raises(ManifestError, match="front_int8.pte"):
        install("android", export, repo)
    assert not (repo / ANDROID_ASSETS / "export").exists()
    assert not (repo / "android_demo" / "harmony.properties").exists()


def test_android_refuses_an_export_without_a_p256_signature(repo, export, tmp_path):
    from harmony_mobile.export.keys import load_or_create_signing_key

    key, _ = load_or_create_signing_key(tmp_path / "keys")
    manifest = read_manifest(export)
    manifest.signature = signature_info(key.public_key())
    write_signed_manifest(export, manifest, key)
    (export / P256_SIGNATURE_FILE).unlink()
    with pytest.raises(ExportAppError, match="P-256"):
        install("android", export, repo)
    install("ios", export, repo)  # iOS verifies Ed25519 and still works


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"server_url": "ftp://laptop"}, "http"),
        ({"server_url": 'http://x" ; rm'}, "http"),
        ({"run_dir": Path("/nonexistent-run")}, "federation_secret"),
    ],
)
def test_bad_options_say_what_is_wrong(repo, export, kwargs, message):
    with pytest.raises(ExportAppError, match=message):
        install("android", export, repo, **kwargs)


def test_unknown_platform_and_repository(repo, export, tmp_path):
    with pytest.raises(ExportAppError, match="android, ios"):
        install("windows", export, repo)
    with pytest.raises(ExportAppError, match="--repo"):
        find_repository(tmp_path)
    assert find_repository(ROOT / "android_demo" / "harmony-core") == ROOT


def test_the_command(repo, export):
    runner = CliRunner()
    result = runner.invoke(app, ["export-app", "ios", "--export", str(export), "--repo", str(repo)])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and (repo / IOS_APP / "Export" / MANIFEST_FILE).is_file()
    failed = runner.invoke(app, ["export-app", "android", "--export", str(repo), "--repo", str(repo)])
    assert failed.exit_code == 2 and "manifest.json: missing" in failed.output
