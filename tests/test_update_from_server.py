"""A phone's model update end to end, over real sockets: the Python device ModelStore runs export A,
a live `harmony serve` serves export B (same key, newer manifest_version); the phone fetches B's
signed manifest and its artifact from the server (GET /v1/manifest, /v1/manifest.sig,
/v1/artifacts/{path}: the default artifact base URL), verifies and switches to it. A server
still serving A is then refused as a rollback, and the installed model stays B."""

from __future__ import annotations

import hashlib
import shutil

import httpx
import pytest
from harmony_mobile.export.keys import encode_public_key, load_or_create_signing_key
from harmony_mobile.export.manifest import (
    encode_signature,
    manifest_to_bytes,
    read_manifest,
    sign_manifest,
)
from harmony_mobile.export.pipeline import export_run

from harmony_mobile.device import (
    ARTIFACTS_PATH,
    ModelStore,
    RollbackError,
    decode_public_key,
    fetch_server_artifact,
    fetch_signed_manifest,
    load_front_end,
)
from tests.export_fixtures import make_run_dir
from tests.helpers.fallback_server import ADMIN
from tests.server_process import serve

TIER = "tiny"


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """(export A, export B, pinned key): B is A re-signed by the same key with a higher
    manifest_version, as the next `harmony export` of the lineage would be."""
    root = tmp_path_factory.mktemp("update")
    key, _ = load_or_create_signing_key(root / "keys")
    a = root / "export-a"
    run = make_run_dir(root / "run")
    export_run(run, a, tiers=[TIER], private_key=key, latency_runs=2, test_samples=8, progress=False)
    b = shutil.copytree(a, root / "export-b")
    manifest = read_manifest(b)
    newer = manifest.model_copy(update={"manifest_version": manifest.manifest_version + 1})
    data = manifest_to_bytes(newer)
    (b / "manifest.json").write_bytes(data)
    (b / "manifest.sig").write_bytes(encode_signature(sign_manifest(data, key)))
    (b / "manifest.p256.sig").unlink(missing_ok=True)  # it would cover A's bytes; this phone verifies Ed25519
    return a, b, encode_public_key(key.public_key())


def phone_update(base: str, store: ModelStore, requested: list[str]):
    """What the phone does: enrol, then the update from the server with its device token."""
    token = httpx.post(f"{base}/v1/devices", headers=ADMIN, json={"tier": TIER}).json()["token"]
    hook = {"request": [lambda request: requested.append(request.url.path)]}
    with httpx.Client(base_url=base, event_hooks=hook, timeout=30) as http:
        return store.install(*fetch_signed_manifest(http, token), fetch_server_artifact(http, token)), token


def test_the_phone_installs_the_newer_export_from_the_server_and_refuses_the_older(exports, tmp_path):
    a, b, pinned = exports
    store = ModelStore(tmp_path / "phone", decode_public_key(pinned), TIER)
    installed_a = store.install(
        (a / "manifest.json").read_bytes(), (a / "manifest.sig").read_bytes(), lambda p: (a / p).read_bytes()
    )
    requested: list[str] = []
    with serve(tmp_path / "data-b", b) as base:
        installed, token = phone_update(base, store, requested)
        # the personalization programs the tier lists are served as well, byte for byte
        programs = installed.manifest["tiers"][0]["personalization"]
        with httpx.Client(base_url=base, timeout=30) as http:
            fetch = fetch_server_artifact(http, token)
            for key in ("frozen_program", "training_program", "head_program"):
                assert hashlib.sha256(fetch(programs[key]["path"])).hexdigest() == programs[key]["sha256"]
    assert installed.manifest_version == installed_a.manifest_version + 1
    assert store.current().manifest_version == installed.manifest_version
    artifact = store.current().manifest["tiers"][0]["artifacts"][0]
    assert f"{ARTIFACTS_PATH}/{artifact['path']}" in requested  # downloaded from the server
    assert (installed.directory / artifact["path"]).read_bytes() == (b / artifact["path"]).read_bytes()
    assert load_front_end(installed.directory, installed.manifest, TIER) is not None

    with serve(tmp_path / "data-a", a) as base, pytest.raises(RollbackError):
        phone_update(base, store, requested := [])
    assert not any(path.startswith(ARTIFACTS_PATH) for path in requested)  # refused before any download
    assert store.current().manifest_version == installed.manifest_version
