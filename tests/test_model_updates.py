"""The Python device runtime's model updates (harmony_mobile/device/model_store.py): a newer signed
manifest and its artifact are installed and switched to atomically; an older one (rollback), a
reused version with other content, another key's signature or a tampered artifact are refused and
leave the installed model as it was; the variant a phone runs is a passing one first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harmony_mobile.export.keys import load_or_create_p256_signing_key, load_or_create_signing_key
from harmony_mobile.export.manifest import (
    MANIFEST_FILE,
    SIGNATURE_FILE,
    encode_signature,
    manifest_to_bytes,
    read_manifest,
    sign_manifest,
    signature_info,
)

from harmony_mobile.device import DeviceError, ModelStore, RollbackError, choose_artifact, is_update
from tests.export_fixtures import fake_export_dir

TIER = "entry-android"


@pytest.fixture
def export(tmp_path) -> Path:
    return fake_export_dir(tmp_path / "export", tmp_path / "keys")


@pytest.fixture
def store(tmp_path, export) -> ModelStore:
    key, _ = load_or_create_signing_key(tmp_path / "keys")
    return ModelStore(tmp_path / "phone", key.public_key(), TIER)


def signed(export: Path, key_dir: Path, **changes) -> tuple[bytes, bytes]:
    """(manifest bytes, manifest.sig) of the export's manifest with `changes`, signed by `key_dir`'s key."""
    key, _ = load_or_create_signing_key(key_dir)
    p256, _ = load_or_create_p256_signing_key(key_dir)
    manifest = read_manifest(export).model_copy(update=changes)
    manifest.signature = signature_info(key.public_key(), p256.public_key())
    data = manifest_to_bytes(manifest)
    return data, encode_signature(sign_manifest(data, key))


def fetcher(export: Path, log: list[str] | None = None):
    def fetch(path: str) -> bytes:
        if log is not None:
            log.append(path)
        return (export / path).read_bytes()

    return fetch


def test_first_install_then_a_newer_version_switches_and_the_old_one_goes(store, export, tmp_path):
    version = read_manifest(export).manifest_version
    log: list[str] = []
    first = store.install(*signed(export, tmp_path / "keys"), fetcher(export, log))
    assert first.manifest_version == version and log == ["entry-android/front_int8.pte"]
    assert store.current().manifest_version == version
    assert store.install(*signed(export, tmp_path / "keys"), fetcher(export)) is None  # the same manifest
    newer = store.install(*signed(export, tmp_path / "keys", manifest_version=version + 1), fetcher(export))
    assert newer.manifest_version == version + 1 and store.current().directory == newer.directory
    assert [p.name for p in (store.root / "versions").iterdir()] == [str(version + 1)]
    pointer = json.loads((store.root / "current.json").read_text())
    assert pointer["manifest_version"] == version + 1
    assert not [p for p in store.root.iterdir() if p.name.startswith(".")], "no staging or temp file left"


def test_an_older_manifest_signed_by_the_pinned_key_is_a_rollback(store, export, tmp_path):
    version = read_manifest(export).manifest_version
    store.install(*signed(export, tmp_path / "keys", manifest_version=version + 5), fetcher(export))
    with pytest.raises(RollbackError, match=rf"manifest_version {version} .* older than .* {version + 5}"):
        store.install(*signed(export, tmp_path / "keys"), fetcher(export))
    with pytest.raises(RollbackError, match="as old as, but different from"):
        store.install(
            *signed(export, tmp_path / "keys", manifest_version=version + 5, model_version="other"),
            fetcher(export),
        )
    assert store.current().manifest_version == version + 5


def test_a_newer_manifest_under_another_key_or_with_a_tampered_artifact_is_refused(store, export, tmp_path):
    version = read_manifest(export).manifest_version
    store.install(*signed(export, tmp_path / "keys"), fetcher(export))
    with pytest.raises(DeviceError, match="pinned key"):
        store.install(*signed(export, tmp_path / "attacker", manifest_version=version + 1), fetcher(export))
    with pytest.raises(DeviceError, match="does not match the signed manifest"):
        store.install(
            *signed(export, tmp_path / "keys", manifest_version=version + 1), lambda path: b"tampered model"
        )
    assert store.current().manifest_version == version
    assert not [p for p in store.root.iterdir() if p.name.startswith(".staging-")]


def test_a_damaged_installed_model_is_noticed_but_still_bars_older_versions(store, export, tmp_path):
    version = read_manifest(export).manifest_version
    installed = store.install(
        *signed(export, tmp_path / "keys", manifest_version=version + 1), fetcher(export)
    )
    (installed.directory / "entry-android" / "front_int8.pte").write_bytes(b"bit rot")
    with pytest.raises(DeviceError, match="does not match the signed manifest"):
        store.current()
    with pytest.raises(RollbackError):
        store.install(*signed(export, tmp_path / "keys"), fetcher(export))
    repaired = store.install(
        *signed(export, tmp_path / "keys", manifest_version=version + 2), fetcher(export)
    )
    assert store.current().directory == repaired.directory


def test_is_update_on_manifests_without_a_version():
    assert is_update(None, {}, b"{}") is True
    assert is_update((0, "0" * 64), {"manifest_version": 1}, b"x") is True
    with pytest.raises(RollbackError):
        is_update((3, "0" * 64), {}, b"{}")  # written before versions existed: older than any
    with pytest.raises(DeviceError, match="non-negative integer"):
        is_update(None, {"manifest_version": "7"}, b"")


def _entry(*variants: tuple[str, str, str]) -> dict:
    return {
        "name": "t",
        "artifacts": [
            {"backend": backend, "quantization": quantization, "verdict": verdict}
            for backend, quantization, verdict in variants
        ],
    }


@pytest.mark.parametrize(
    "variants, chosen",
    [
        ([("xnnpack", "fp32", "pass"), ("xnnpack", "int8", "pass")], "int8"),  # both pass: the smaller
        ([("xnnpack", "fp32", "pass"), ("xnnpack", "int8", "fail")], "fp32"),  # int8 missed its gate
        ([("xnnpack", "int8", "fail")], "int8"),  # nothing else shipped
        ([("xnnpack", "fp32", "not_checked"), ("xnnpack", "int8", "fail")], "fp32"),
        ([("coreml", "coreml-fp16", "not_checked"), ("xnnpack", "int8", "pass")], "int8"),
    ],
)
def test_a_passing_variant_is_preferred(variants, chosen):
    assert choose_artifact(_entry(*variants))["quantization"] == chosen


def test_choose_artifact_without_verdicts_and_without_the_backend():
    older = {"name": "t", "artifacts": [{"backend": "xnnpack", "quantization": q} for q in ("fp32", "int8")]}
    assert choose_artifact(older)["quantization"] == "int8"
    with pytest.raises(DeviceError, match="no coreml artifact"):
        choose_artifact(older, "coreml")


def test_the_signed_files_the_store_keeps_are_the_servers_bytes(store, export, tmp_path):
    data, signature = signed(export, tmp_path / "keys")
    installed = store.install(data, signature, fetcher(export))
    assert (installed.directory / MANIFEST_FILE).read_bytes() == data
    assert (installed.directory / SIGNATURE_FILE).read_bytes() == signature


def test_fetch_signed_manifest_sends_the_token_and_names_a_failure():
    import httpx

    from harmony_mobile.device import fetch_signed_manifest

    def serve(request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != "Bearer t0ken":
            return httpx.Response(401, text="unauthorized")
        body = {"/v1/manifest": b'{"manifest_version": 2}', "/v1/manifest.sig": b"c2ln"}.get(request.url.path)
        return httpx.Response(404, text="no manifest") if body is None else httpx.Response(200, content=body)

    with httpx.Client(base_url="http://server", transport=httpx.MockTransport(serve)) as http:
        assert fetch_signed_manifest(http, "t0ken") == (b'{"manifest_version": 2}', b"c2ln")
        with pytest.raises(DeviceError, match="401"):
            fetch_signed_manifest(http, "wrong")
