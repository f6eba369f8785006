"""GET /v1/artifacts/{path} on a live `harmony serve`: the served manifest's tier artifacts (an
.mlpackage file by file) byte for byte under their manifest digest; anything else, however the path
is spelled, is a 404 with the JSON error body, and nothing answers without a device token."""

from __future__ import annotations

import hashlib
import http.client
import json
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.export_fixtures import fake_export_dir
from tests.helpers.fallback_server import ADMIN
from tests.server_process import serve

PHONE_FILES = [
    "entry-android/front_fp32.pte",
    "entry-android/front_int8.pte",
    "mid-ios/front_coreml-fp16.mlpackage/Manifest.json",
    "mid-ios/front_coreml-fp16.mlpackage/Data/com.apple.CoreML/model.mlmodel",
    "mid-ios/front_coreml-fp16.mlpackage/Data/com.apple.CoreML/weights/weight.bin",
]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """(base URL, export dir, device token): the fake export served (its dummy back-end removed, so
    the server starts without one: artifacts do not need it)."""
    root = tmp_path_factory.mktemp("artifacts")
    export = fake_export_dir(root / "model", root / "keys")
    (export / "backend" / "backend.pt").unlink()
    with serve(root / "data", export, ready=False) as base:
        enrolled = httpx.post(f"{base}/v1/devices", headers=ADMIN, json={"tier": "entry-android"})
        yield base, export, enrolled.json()["token"]


def raw_get(base: str, target: str, token: str | None) -> tuple[int, dict[str, str], bytes]:
    """A GET with `target` on the request line exactly as given (httpx would resolve `..` first)."""
    url = urlsplit(base)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        connection.request("GET", target, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def test_every_file_a_phone_loads_downloads_with_its_manifest_digest(live):
    base, export, token = live
    entries = {e["path"]: e for e in json.loads((export / "manifest.json").read_text())["files"]}
    for path in PHONE_FILES:
        status, headers, body = raw_get(base, f"/v1/artifacts/{path}", token)
        assert status == 200, path
        assert body == (export / path).read_bytes()
        assert (
            hashlib.sha256(body).hexdigest() == entries[path]["sha256"] and len(body) == entries[path]["size"]
        )
        assert headers["etag"] == f'"{entries[path]["sha256"]}"'
        assert headers["content-type"] == "application/octet-stream"
    status, headers, body = raw_get(base, f"/v1/artifacts/{PHONE_FILES[0]}", token)
    url = urlsplit(base)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    connection.request(
        "GET",
        f"/v1/artifacts/{PHONE_FILES[0]}",
        headers={"Authorization": f"Bearer {token}", "If-None-Match": headers["etag"]},
    )
    assert connection.getresponse().status == 304
    connection.close()


@pytest.mark.parametrize(
    "target",
    [
        "/v1/artifacts/verification.json",  # listed in the manifest, but a report, not a phone's file
        "/v1/artifacts/backend/backend.pt2",  # the back-end stays on the server
        "/v1/artifacts/manifest.json",
        "/v1/artifacts/nothing.pte",
        "/v1/artifacts/mid-ios/front_coreml-fp16.mlpackage",  # a directory: its files, not the directory
        "/v1/artifacts/entry-android/../verification.json",
        "/v1/artifacts/entry-android/../../keys/signing_key",
        "/v1/artifacts/..%2F..%2Fkeys%2Fsigning_key",
        "/v1/artifacts/%2e%2e/%2e%2e/data/server_key",
        "/v1/artifacts//etc/passwd",
        "/v1/artifacts/%2Fetc%2Fpasswd",
        "/v1/artifacts/entry-android%2F..%2Fverification.json",
        "/v1/artifacts/entry-android/./front_fp32.pte",
        "/v1/artifacts/",
    ],
)
def test_anything_else_is_a_404_with_the_json_error_body(live, target):
    base, _, token = live
    status, headers, body = raw_get(base, target, token)
    assert status == 404, (target, body)
    assert headers["content-type"] == "application/json"
    assert isinstance(json.loads(body)["detail"], str)


def test_artifacts_need_a_token_as_the_manifest_does(live):
    base, _, _ = live
    for token in (None, "not-a-token"):
        for path in ("/v1/manifest", f"/v1/artifacts/{PHONE_FILES[0]}"):
            status, _, body = raw_get(base, path, token)
            assert status == 401 and "detail" in json.loads(body)


def test_a_file_changed_on_disk_is_not_served_under_the_old_digest(tmp_path):
    export = fake_export_dir(tmp_path / "model", tmp_path / "keys")
    (export / "backend" / "backend.pt").unlink()
    with serve(tmp_path / "data", export, ready=False) as base:
        token = httpx.post(f"{base}/v1/devices", headers=ADMIN, json={}).json()["token"]
        Path(export / PHONE_FILES[1]).write_bytes(b"replaced after the server started")
        status, headers, body = raw_get(base, f"/v1/artifacts/{PHONE_FILES[1]}", token)
        assert (
            status == 503
            and headers["retry-after"] == "1"
            and "does not match the served manifest" in json.loads(body)["detail"]
        )
        assert raw_get(base, f"/v1/artifacts/{PHONE_FILES[0]}", token)[0] == 200
