"""`harmony export-app android|ios`: a verified export, the key the app pins and the server URL land
where each demo app reads them; the run's federation secret never does (it goes into a provisioning
payload outside the app), and an export signed by another key is refused."""

from __future__ import annotations

import base64
import re
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from harmony_mobile.export.apps import ExportAppError, find_repository, install
from harmony_mobile.export.keys import (
    P256_PUBLIC_KEY_FILE,
    PUBLIC_KEY_FILE,
    decode_p256_public_key,
    decode_public_key,
    load_or_create_p256_signing_key,
    load_or_create_signing_key,
)
from harmony_mobile.export.manifest import (
    MANIFEST_FILE,
    P256_SIGNATURE_FILE,
    SIGNATURE_FILE,
    ManifestError,
    Personalization,
    ProgramFile,
    list_files,
    path_digest,
    read_manifest,
    signature_info,
    write_signed_manifest,
)
from harmony_mobile.export.provisioning import parse_payload
from typer.testing import CliRunner

from harmony_mobile.cli import app
from harmony_mobile.run_dir import write_federation_secret
from tests.export_fixtures import FIXTURE_SECRET, fake_export_dir

ROOT = Path(__file__).resolve().parents[1]
ANDROID_ASSETS = Path("android_demo/app/src/main/assets")
IOS_APP = Path("ios_demo/HarmonyDemo")
IOS_RESOURCES = IOS_APP / "HarmonyDemo" / "Resources"
APP_TREES = ("android_demo", "ios_demo")


@pytest.fixture
def repo(tmp_path) -> Path:
    """The parts of a checkout that export-app reads or writes, with the provisioning file an older
    export-app left in each app."""
    repo = tmp_path / "repo"
    (repo / IOS_APP / "Export").mkdir(parents=True)
    shutil.copy2(ROOT / IOS_APP / "Export" / "README.md", repo / IOS_APP / "Export" / "README.md")
    for folder in (ANDROID_ASSETS, IOS_RESOURCES):
        (repo / folder).mkdir(parents=True, exist_ok=True)
        (repo / folder / "provisioning.local.json").write_text('{"federation_secret_hex": "stale"}')
    return repo


@pytest.fixture
def keys(tmp_path) -> Path:
    return tmp_path / "keys"


@pytest.fixture
def export(tmp_path, keys) -> Path:
    """demo-output layout: export/ beside run/ (which holds the run's federation secret)."""
    out = fake_export_dir(tmp_path / "demo-output" / "export", keys)
    (tmp_path / "demo-output" / "run").mkdir()
    write_federation_secret(
        tmp_path / "demo-output" / "run", FIXTURE_SECRET
    )  # where `harmony train` keeps it
    return out


def _secret_encodings(secret: bytes) -> dict[str, bytes]:
    """The secret as raw bytes, hex (both cases) and base64 (both alphabets, at every alignment
    inside a longer base64 stream: the middle of each encoding is fixed by the secret alone)."""
    found = {"raw": secret, "hex": secret.hex().encode(), "HEX": secret.hex().upper().encode()}
    for shift in range(3):
        for name, encode in (("base64", base64.b64encode), ("base64url", base64.urlsafe_b64encode)):
            found[f"{name}@{shift}"] = encode(bytes(shift) + secret)[4:-4]
    return found


def _app_files(repo: Path) -> list[Path]:
    return sorted(p for tree in APP_TREES for p in (repo / tree).rglob("*") if p.is_file())


def _assert_no_secret_in_the_apps(repo: Path) -> list[str]:
    """Every byte export-app left under the app trees (assets/, Resources/, Export/, properties),
    searched for the secret in every encoding; returns the files' paths."""
    files = _app_files(repo)
    encodings = _secret_encodings(FIXTURE_SECRET)
    for path in files:
        data = path.read_bytes()
        leaks = [name for name, needle in encodings.items() if needle in data]
        assert not leaks, f"{path.relative_to(repo)} holds the federation secret ({', '.join(leaks)})"
        assert path.name not in ("provisioning.local.json", "provisioning.json"), path
    return [p.relative_to(repo).as_posix() for p in files]


def _properties(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def _assert_payload(result, export: Path) -> None:
    """The payload sits beside the export, owner-only, and carries the run's secret."""
    assert result.payload.parent == export.parent and result.payload.stat().st_mode & 0o777 == 0o600
    provisioning = parse_payload(result.payload.read_text())
    assert provisioning.federation_secret == FIXTURE_SECRET and provisioning.server_url == result.server_url


def test_android_gets_the_p256_pinned_export_and_no_secret(repo, export, keys):
    stale = repo / ANDROID_ASSETS / "export" / "old-tier" / "front_int8.pte"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an older export")
    result = install("android", export, repo, pinned_key=keys / P256_PUBLIC_KEY_FILE)

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
    assert settings["harmony.pinnedManifestKey"] == (keys / P256_PUBLIC_KEY_FILE).read_text()
    pinned = decode_p256_public_key(settings["harmony.pinnedManifestKey"])
    signature = base64.b64decode((target / P256_SIGNATURE_FILE).read_bytes())
    pinned.verify(signature, (target / MANIFEST_FILE).read_bytes(), ec.ECDSA(hashes.SHA256()))
    # ... then sha256 and size of the artifact it loads.
    manifest = read_manifest(target)
    for artifact in manifest.tier("entry-android").artifacts:
        assert path_digest(target / artifact.path) == (artifact.sha256, artifact.size)
    written = _assert_no_secret_in_the_apps(repo)
    assert "android_demo/harmony.properties" in written and len(written) >= 8
    assert result.removed == [
        repo / ANDROID_ASSETS / "provisioning.local.json",
        repo / IOS_RESOURCES / "provisioning.local.json",
    ]
    _assert_payload(result, export)


def test_ios_gets_the_ed25519_pinned_export_with_core_ml_packages_and_no_secret(repo, export, keys):
    result = install(
        "ios", export, repo, server_url="http://192.168.1.20:8000/", pinned_key=keys / PUBLIC_KEY_FILE
    )
    target = repo / IOS_APP / "Export"
    assert (target / "README.md").read_bytes() == (ROOT / IOS_APP / "Export" / "README.md").read_bytes()
    package = target / "mid-ios" / "front_coreml-fp16.mlpackage"
    manifest = read_manifest(target)
    coreml = manifest.tier("mid-ios").artifacts[0]
    assert package.is_dir() and path_digest(package) == (coreml.sha256, coreml.size)
    resources = repo / IOS_RESOURCES
    pinned = decode_public_key((resources / "pinned_signing_key.pub").read_text())
    pinned.verify(
        base64.b64decode((target / SIGNATURE_FILE).read_bytes()), (target / MANIFEST_FILE).read_bytes()
    )
    assert (resources / "server_url.txt").read_text() == "http://192.168.1.20:8000\n"
    written = _assert_no_secret_in_the_apps(repo)
    assert f"{IOS_RESOURCES.as_posix()}/pinned_signing_key.pub" in written
    assert result.server_url == "http://192.168.1.20:8000"
    _assert_payload(result, export)


def test_the_secret_scan_catches_a_secret_in_any_encoding(repo):
    """The scan above is not vacuous: each encoding, even inside a longer base64 stream, is found."""
    for stale in (
        repo / ANDROID_ASSETS / "provisioning.local.json",
        repo / IOS_RESOURCES / "provisioning.local.json",
    ):
        stale.unlink()
    leak = repo / ANDROID_ASSETS / "leak.bin"
    for name, needle in _secret_encodings(FIXTURE_SECRET).items():
        leak.write_bytes(b"prefix " + needle + b" suffix")
        with pytest.raises(AssertionError, match=rf"holds the federation secret \([^)]*{re.escape(name)}"):
            _assert_no_secret_in_the_apps(repo)
    embedded = b'{"federation_secret": "' + base64.b64encode(FIXTURE_SECRET) + b'"}'
    leak.write_bytes(base64.urlsafe_b64encode(b"xx" + base64.b64encode(b"y" + FIXTURE_SECRET)))
    _assert_no_secret_in_the_apps(repo)  # twice encoded: out of the scan's reach, as documented
    leak.write_bytes(embedded)
    with pytest.raises(AssertionError, match="base64"):
        _assert_no_secret_in_the_apps(repo)


def _resign(export: Path, tmp_path: Path) -> None:
    """An attacker replaces the export's signature and both key files with their own."""
    key, _ = load_or_create_signing_key(tmp_path / "attacker")
    p256_key, _ = load_or_create_p256_signing_key(tmp_path / "attacker")
    manifest = read_manifest(export)
    manifest.signature = signature_info(key.public_key(), p256_key.public_key())
    manifest.tiers[0].threshold = 0.01
    write_signed_manifest(export, manifest, key, p256_key)


@pytest.mark.parametrize("platform, key_file", [("android", P256_PUBLIC_KEY_FILE), ("ios", PUBLIC_KEY_FILE)])
def test_an_export_re_signed_with_another_key_is_refused(repo, export, keys, tmp_path, platform, key_file):
    install(platform, export, repo, pinned_key=keys / key_file)
    pinned_before = {
        p: p.read_bytes() for p in _app_files(repo) if "pinned" in p.name or p.suffix == ".properties"
    }
    _resign(export, tmp_path)
    with pytest.raises(ManifestError, match="pinned"):
        install(platform, export, repo)  # the key the app already pins
    with pytest.raises(ManifestError, match="pinned"):
        install(platform, export, repo, pinned_key=keys / key_file)
    assert {p: p.read_bytes() for p in pinned_before} == pinned_before, "the pinned key stays"
    if platform == "android":  # the app's copy is still the genuine export
        assert read_manifest(repo / ANDROID_ASSETS / "export").tiers[0].threshold == 0.9


def test_without_a_pinned_key_export_app_refuses_and_says_how(repo, export):
    with pytest.raises(ExportAppError, match="--pinned-key with the signing_key_p256.pub"):
        install("android", export, repo)
    with pytest.raises(ExportAppError, match="--pinned-key with the signing_key.pub"):
        install("ios", export, repo)
    assert not (repo / ANDROID_ASSETS / "export").exists()


def test_a_wrong_kind_of_pinned_key_is_refused(repo, export, keys):
    with pytest.raises(ExportAppError, match="the android app pins a signing_key_p256.pub key"):
        install("android", export, repo, pinned_key=keys / PUBLIC_KEY_FILE)
    with pytest.raises(ExportAppError, match="the ios app pins a signing_key.pub key"):
        install("ios", export, repo, pinned_key=keys / P256_PUBLIC_KEY_FILE)


def test_without_the_runs_secret_export_app_refuses(repo, export, keys, tmp_path):
    shutil.rmtree(export.parent / "run")
    with pytest.raises(ExportAppError, match="--run"):
        install("android", export, repo, pinned_key=keys / P256_PUBLIC_KEY_FILE)
    other = tmp_path / "other-run"
    write_federation_secret(other, bytes(range(40, 72)))
    with pytest.raises(ExportAppError, match="not this export's"):
        install("android", export, repo, run_dir=other, pinned_key=keys / P256_PUBLIC_KEY_FILE)
    assert not (repo / ANDROID_ASSETS / "export").exists()


def test_a_tampered_export_is_refused_before_anything_is_copied(repo, export, keys):
    (export / "entry-android" / "front_int8.pte").write_bytes(b"tampered")
    with pytest.raises(ManifestError, match="front_int8.pte"):
        install("android", export, repo, pinned_key=keys / P256_PUBLIC_KEY_FILE)
    assert not (repo / ANDROID_ASSETS / "export").exists()
    assert not (repo / "android_demo" / "harmony.properties").exists()


def test_android_refuses_an_export_without_a_p256_signature(repo, export, keys):
    key, _ = load_or_create_signing_key(keys)
    manifest = read_manifest(export)
    manifest.signature = signature_info(key.public_key())
    write_signed_manifest(export, manifest, key)
    (export / P256_SIGNATURE_FILE).unlink()
    with pytest.raises(ManifestError, match="P-256"):
        install("android", export, repo, pinned_key=keys / P256_PUBLIC_KEY_FILE)
    install("ios", export, repo, pinned_key=keys / PUBLIC_KEY_FILE)  # iOS verifies Ed25519 and still works


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"server_url": "ftp://laptop"}, "http"),
        ({"server_url": 'http://x" ; rm'}, "http"),
        ({"run_dir": Path("/nonexistent-run")}, "federation_secret"),
    ],
)
def test_bad_options_say_what_is_wrong(repo, export, keys, kwargs, message):
    with pytest.raises(ExportAppError, match=message):
        install("android", export, repo, pinned_key=keys / P256_PUBLIC_KEY_FILE, **kwargs)


def test_the_payload_is_never_written_into_an_app(repo, export, keys):
    from harmony_mobile.export.provisioning import ProvisioningError

    with pytest.raises(ProvisioningError, match="ship in the app"):
        install(
            "ios", export, repo, pinned_key=keys / PUBLIC_KEY_FILE, payload_out=repo / IOS_RESOURCES / "p.txt"
        )


def test_unknown_platform_and_repository(repo, export, tmp_path):
    with pytest.raises(ExportAppError, match="android, ios"):
        install("windows", export, repo)
    with pytest.raises(ExportAppError, match="--repo"):
        find_repository(tmp_path)
    assert find_repository(ROOT / "android_demo" / "harmony-core") == ROOT


def test_the_command(repo, export, keys):
    runner = CliRunner()
    command = ["export-app", "ios", "--export", str(export), "--repo", str(repo)]
    result = runner.invoke(app, [*command, "--pinned-key", str(keys / PUBLIC_KEY_FILE)])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and (repo / IOS_APP / "Export" / MANIFEST_FILE).is_file()
    assert "provisioning payload" in result.output
    again = runner.invoke(app, command)  # the key the app now pins
    assert again.exit_code == 0, again.output
    failed = runner.invoke(app, ["export-app", "android", "--export", str(repo), "--repo", str(repo)])
    assert failed.exit_code == 2 and "--run" in " ".join(failed.output.split())
    shutil.rmtree(export.parent / "run")
    no_run = runner.invoke(app, command)
    assert no_run.exit_code == 2 and "federation" in " ".join(no_run.output.split())


def _with_personalization(export: Path, keys: Path) -> dict[str, str]:
    """The export with personalization programs for entry-android (as `harmony export` writes them),
    re-signed; returns program key -> path."""
    programs = {}
    for key, name in (("frozen", "frozen"), ("training", "train"), ("head", "head")):
        relpath = f"entry-android/personalize_{name}.pte"
        (export / relpath).write_bytes(f"PTE {name} program ".encode() * 8)
        sha, size = path_digest(export / relpath)
        programs[f"{key}_program"] = ProgramFile(path=relpath, sha256=sha, size=size)
    manifest = read_manifest(export)
    shape = [[2, 4], [2], [4, 4], [4]]
    names = ["classifier.0.weight", "classifier.0.bias", "classifier.2.weight", "classifier.2.bias"]
    entry = manifest.tier("entry-android").model_copy(
        update={
            "personalization": Personalization(
                **programs,
                batch=4,
                hidden=4,
                parameter_names=names,
                parameter_shapes=shape,
                learning_rate=0.1,
            )
        }
    )
    tiers = [entry if t.name == entry.name else t for t in manifest.tiers]
    manifest = manifest.model_copy(update={"tiers": tiers, "files": list_files(export)})
    key, _ = load_or_create_signing_key(keys)
    p256, _ = load_or_create_p256_signing_key(keys)
    write_signed_manifest(export, manifest, key, p256)
    return {name: program.path for name, program in programs.items()}


@pytest.mark.parametrize(
    ("platform", "key_file", "target"),
    [
        ("android", P256_PUBLIC_KEY_FILE, ANDROID_ASSETS / "export"),
        ("ios", PUBLIC_KEY_FILE, IOS_APP / "Export"),
    ],
)
def test_the_personalization_programs_are_copied_with_the_tier_artifacts(
    repo, export, keys, platform, key_file, target
):
    programs = _with_personalization(export, keys)
    result = install(platform, export, repo, pinned_key=keys / key_file)
    manifest = read_manifest(repo / target)
    entry = manifest.tier("entry-android").personalization
    for program in entry.programs():
        assert program.path in result.copied
        assert path_digest(repo / target / program.path) == (program.sha256, program.size)
    assert sorted(p.path for p in entry.programs()) == sorted(programs.values())
