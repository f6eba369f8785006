"""The fallback server over HTTP (httpx via TestClient, real app, real lifespan): health, metadata,
inference (JSON and binary), every bad input, auth, enrolment, limits, metrics and status page."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from harmony_mobile.server import create_app

from harmony_mobile.protocol.wire import encode_tensor
from harmony_mobile.run_dir import load_backend_file
from tests.helpers.fallback_server import (
    ADMIN,
    ADMIN_TOKEN,
    LABEL_EPOCH,
    bearer,
    class_features,
    class_slot_table,
    enrol,
    error_message,
    json_infer_body,
    make_model_dir,
    make_settings,
)

torch.set_num_threads(1)
INFER = "/v2/models/harmony-backend/infer"
BINARY = {"content-type": "application/octet-stream"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def client(tmp_path_factory, model_dir):
    root = tmp_path_factory.mktemp("server")
    with TestClient(create_app(make_settings(root, model_dir, max_request_rows=8))) as client:
        yield client


@pytest.fixture(scope="module")
def device(client):
    return enrol(client)


@pytest.fixture(scope="module")
def auth(device):
    return bearer(device["token"])


def features(rows: int = 2, seed: int = 0) -> np.ndarray:
    return class_features(np.arange(rows) % 10, seed)


# ---------------------------------------------------------------- health and metadata


def test_health_and_server_metadata_need_no_token(client):
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}
    metadata = client.get("/v2").json()
    assert metadata["name"] == "harmony-mobile" and "harmony-binary-tensor" in metadata["extensions"]


def test_not_ready_without_a_backend(tmp_path):
    with TestClient(create_app(make_settings(tmp_path, None))) as client:
        response = client.get("/v2/health/ready")
        assert response.status_code == 503 and response.json() == {"ready": False}
        assert response.headers["retry-after"] == "1"
        assert client.get("/v2/health/live").status_code == 200
        device = enrol(client)
        assert device["default_version"] is None and device["manifest"] is None
        assert device["label_epoch"] is None and device["slot_table"] is None
        no_model = client.post(INFER, json=json_infer_body(features()), headers=bearer(device["token"]))
        assert no_model.status_code == 503 and "no back-end" in error_message(no_model)


def test_infer_checks_run_in_the_documented_order(tmp_path, client, auth):
    """docs/PROTOCOL.md 6.4: the earliest failing check answers, whatever else is wrong."""
    bad_shape = json.dumps(json_infer_body(np.zeros((1, 3), np.float32), parameters={"tier": "nope"}))
    text_plain = {**auth, "Content-Type": "text/plain"}
    with TestClient(create_app(make_settings(tmp_path, None))) as empty:
        token = bearer(enrol(empty)["token"])
        no_model = empty.post(INFER, content=bad_shape, headers={**token, "Content-Type": "text/plain"})
        assert no_model.status_code == 503 and "no back-end" in error_message(no_model)
    header = client.post(
        "/v2/models/other/infer",
        content=bad_shape,
        headers={**text_plain, "Inference-Header-Content-Length": "x"},
    )
    assert header.status_code == 422 and "Inference-Header-Content-Length" in error_message(header)
    assert client.post("/v2/models/other/infer", content=bad_shape, headers=text_plain).status_code == 404
    encoding = client.post(INFER, content=bad_shape, headers={**text_plain, "Content-Encoding": "br"})
    assert encoding.status_code == 415 and "Content-Encoding" in error_message(encoding)
    media = client.post(INFER, content=bad_shape, headers=text_plain)
    assert media.status_code == 415 and "content type" in error_message(media)
    tier = client.post(INFER, content=bad_shape, headers={**auth, "Content-Type": "application/json"})
    assert tier.status_code == 422 and "parameters.tier 'nope'" in error_message(tier)


def test_model_metadata_in_kserve_shape(client, auth):
    for path in ("/v2/models/harmony-backend", "/v2/models/harmony-backend/versions/v1"):
        metadata = client.get(path, headers=auth).json()
        assert metadata["versions"] == ["v1"]
        assert metadata["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 64, 8, 8]}]
        assert [o["name"] for o in metadata["outputs"]] == ["slot_scores", "top_slot", "confidence"]
        assert metadata["outputs"][0]["shape"] == [-1, 10]
        assert metadata["parameters"] == {
            "label_epoch": LABEL_EPOCH,
            "slot_table": class_slot_table().to_hex(),
        }
    ready = client.get("/v2/models/harmony-backend/versions/v1/ready", headers=auth).json()
    assert ready == {"name": "harmony-backend", "version": "v1", "ready": True}
    assert client.get("/v2/models/harmony-backend/ready", headers=auth).json()["ready"] is True


@pytest.mark.parametrize(
    "path,message",
    [
        ("/v2/models/resnet50", "unknown model 'resnet50'"),
        ("/v2/models/harmony-backend/versions/v9", "no back-end version 'v9'; known: v1"),
        ("/v2/models/harmony-backend/versions/v9/ready", "no back-end version 'v9'"),
    ],
)
def test_unknown_model_or_version_is_404(client, auth, path, message):
    response = client.get(path, headers=auth)
    assert response.status_code == 404 and message in error_message(response)


# ---------------------------------------------------------------- inference


def expected_outputs(model_dir, x: np.ndarray):
    loaded = load_backend_file(model_dir / "backend" / "backend.pt")
    with torch.no_grad():
        logits = loaded.backend(torch.from_numpy(x))
    return logits.numpy(), torch.softmax(logits, 1).max(1)


def test_json_infer_matches_the_backend(client, auth, model_dir):
    x = features(3)
    response = client.post(
        INFER, json=json_infer_body(x, id="req-1", parameters={"tier": "mid-android"}), headers=auth
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model_name"] == "harmony-backend" and body["model_version"] == "v1" and body["id"] == "req-1"
    logits, (confidence, top) = expected_outputs(model_dir, x)
    outputs = {o["name"]: o for o in body["outputs"]}
    assert set(outputs) == {"slot_scores", "top_slot", "confidence"}  # slots only, never named classes
    assert outputs["slot_scores"]["shape"] == [3, 10]
    np.testing.assert_allclose(
        np.array(outputs["slot_scores"]["data"]).reshape(3, 10), logits, rtol=1e-5, atol=1e-5
    )
    assert outputs["top_slot"]["data"] == top.tolist() and outputs["top_slot"]["datatype"] == "INT64"
    np.testing.assert_allclose(outputs["confidence"]["data"], confidence.numpy(), rtol=1e-5)


def test_binary_infer_equals_json_infer(client, auth):
    x = features(2, seed=3)
    as_json = client.post(INFER, json=json_infer_body(x), headers=auth).json()
    as_binary = client.post(
        "/v2/models/harmony-backend/versions/v1/infer",
        content=encode_tensor(x),
        headers={**auth, **BINARY, "X-Harmony-Tier": "mid-android"},
    )
    assert as_binary.status_code == 200, as_binary.text
    assert as_binary.json()["outputs"] == as_json["outputs"]


@pytest.mark.parametrize(
    "tier,message",
    [
        ("made-up", "is not a tier of this server (known: entry-android, flagship, mid-android, mid-ios)"),
        ("flagship", "is not the tier 'mid-android' this device was enrolled with"),
    ],
)
def test_an_infer_request_names_the_devices_own_tier(client, auth, tier, message):
    """The tier only feeds a counter, but a phone that names another is misconfigured: say so."""
    binary = client.post(
        INFER, content=encode_tensor(features(1)), headers={**auth, **BINARY, "X-Harmony-Tier": tier}
    )
    assert binary.status_code == 422 and error_message(binary) == f"X-Harmony-Tier {tier!r} {message}"
    as_json = client.post(INFER, json=json_infer_body(features(1), parameters={"tier": tier}), headers=auth)
    assert as_json.status_code == 422 and error_message(as_json) == f"parameters.tier {tier!r} {message}"
    number = client.post(INFER, json=json_infer_body(features(1), parameters={"tier": 5}), headers=auth)
    assert number.status_code == 422 and "parameters.tier must be a string" in error_message(number)
    admin = client.post(
        INFER, json=json_infer_body(features(1), parameters={"tier": "flagship"}), headers=ADMIN
    )
    assert admin.status_code == 200  # the admin token has no tier of its own


def test_json_labelled_octet_stream_is_a_json_request(client, auth):
    # Without Inference-Header-Content-Length a V2 body is JSON whatever its Content-Type (aiohttp,
    # so tritonclient.http.aio, labels it application/octet-stream); an HMFT body starts with its
    # magic, never with "{", so the two cannot be mistaken for each other.
    x = features(2, seed=5)
    as_json = client.post(INFER, json=json_infer_body(x, id="oct"), headers=auth).json()
    raw = b"\n  " + json.dumps(json_infer_body(x, id="oct")).encode()
    labelled = client.post(INFER, content=raw, headers={**auth, **BINARY})
    assert labelled.status_code == 200, labelled.text
    assert labelled.json() == as_json
    invalid = client.post(INFER, content=b'{"inputs": []}', headers={**auth, **BINARY})
    assert invalid.status_code == 422 and "invalid infer request: inputs" in error_message(invalid)


def test_nested_json_data_is_accepted(client, auth):
    x = features(1)
    body = json_infer_body(x)
    body["inputs"][0]["data"] = x.tolist()
    flat = client.post(INFER, json=json_infer_body(x), headers=auth).json()
    assert client.post(INFER, json=body, headers=auth).json()["outputs"] == flat["outputs"]


def bad_input(**changes) -> dict:
    tensor = {"name": "features", "shape": [1, 64, 8, 8], "datatype": "FP32", "data": [0.0] * 4096}
    tensor.update(changes)
    return {"inputs": [tensor]}


@pytest.mark.parametrize(
    "body,message",
    [
        (
            bad_input(shape=[1, 64, 4, 4], data=[0.0] * 1024),
            "has shape [1, 64, 4, 4]; expected [N, 64, 8, 8]",
        ),
        (bad_input(shape=[64, 8, 8]), "has shape [64, 8, 8]; expected [N, 64, 8, 8]"),
        (bad_input(shape=[1, 64, 8, 0], data=[]), "every dimension must be >= 1"),
        (bad_input(datatype="FP16"), "datatype 'FP16'; this model accepts 'FP32' only"),
        (bad_input(datatype="INT8"), "datatype 'INT8'"),
        (bad_input(data=[0.0] * 4095), "holds 4095 values; shape [1, 64, 8, 8] needs 4096"),
        (bad_input(data=["a"] * 4096), "data must be finite numbers"),
        (bad_input(data=[10**400] + [0.0] * 4095), "data must be finite numbers"),  # OverflowError
        (bad_input(data=[1e38] * 4096), "so large that the model output overflows"),
        (bad_input(name="pixels"), "unknown input 'pixels'"),
        (
            bad_input(shape=[9, 64, 8, 8], data=[0.0] * 9 * 4096),
            "has 9 rows; the limit is 1..8",
        ),
        ({"inputs": []}, "inputs: List should have at least 1 item"),
        ({"inputs": [bad_input()["inputs"][0]] * 2}, "inputs: List should have at most 1 item"),
        (bad_input(shape=["1", 64, 8, 8]), "shape.0: must be a JSON number"),
        ({"tensors": []}, "inputs: Field required"),
    ],
)
def test_bad_json_input_is_422_with_exact_message(client, auth, body, message):
    response = client.post(INFER, json=body, headers=auth)
    assert response.status_code == 422
    assert message in error_message(response)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_json_values_are_422(client, auth, value):
    raw = json.dumps(bad_input()).replace("0.0", value, 1)  # JSON has no NaN; Python-style clients send it
    response = client.post(INFER, content=raw, headers={**auth, "content-type": "application/json"})
    assert response.status_code == 422
    assert "contains NaN or Inf (first at flat index 0" in error_message(response)


def test_non_finite_binary_values_are_422(client, auth):
    x = features(1)
    x[0, 5, 2, 1] = np.inf
    response = client.post(INFER, content=encode_tensor(x), headers={**auth, **BINARY})
    assert response.status_code == 422
    assert f"flat index {5 * 64 + 2 * 8 + 1}, value inf" in error_message(response)


@pytest.mark.parametrize(
    "body,status,message",
    [
        (
            b"HMFT",
            400,
            "malformed binary body: binary tensor is 4 bytes, shorter than the 8-byte fixed header",
        ),
        (b"XXXX" + encode_tensor(features(1))[4:], 400, "magic"),
        (encode_tensor(features(1))[:-4], 400, "body has 16380"),
        (encode_tensor(features(1))[:5] + b"\x02" + encode_tensor(features(1))[6:], 400, "dtype code 2"),
        (encode_tensor(np.zeros((1, 32, 8, 8), np.float32)), 422, "has shape [1, 32, 8, 8]"),
        (encode_tensor(np.zeros((9, 64, 8, 8), np.float32)), 422, "has 9 rows"),
    ],
)
def test_bad_binary_input(client, auth, body, status, message):
    response = client.post(INFER, content=body, headers={**auth, **BINARY})
    assert response.status_code == status
    assert message in error_message(response)


def test_unknown_content_type_is_415(client, auth):
    response = client.post(INFER, content=b"1,2,3", headers={**auth, "content-type": "text/csv"})
    assert response.status_code == 415 and "'text/csv' is not accepted" in error_message(response)


def test_infer_on_unknown_version_or_model_is_404(client, auth):
    x = json_infer_body(features(1))
    response = client.post("/v2/models/harmony-backend/versions/v7/infer", json=x, headers=auth)
    assert response.status_code == 404 and "no back-end version 'v7'" in error_message(response)
    response = client.post("/v2/models/other/infer", json=x, headers=auth)
    assert response.status_code == 404 and "unknown model 'other'" in error_message(response)


# ---------------------------------------------------------------- auth and devices


def test_auth_failures(client, device):
    x = json_infer_body(features(1))
    missing = client.post(INFER, json=x)
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert "missing bearer token" in error_message(missing)
    wrong = client.post(INFER, json=x, headers=bearer("not-a-token"))
    assert wrong.status_code == 401 and error_message(wrong) == "unknown bearer token"
    basic = client.post(INFER, json=x, headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert basic.status_code == 401
    # a device token on admin endpoints is 403, the admin token on the device-only upload is 403
    for method, path in [("post", "/v1/devices"), ("get", "/v1/devices"), ("post", "/v1/alignment/rounds")]:
        response = getattr(client, method)(
            path, headers=bearer(device["token"]), **({"json": {}} if method == "post" else {})
        )
        assert response.status_code == 403 and "admin token" in error_message(response)
    upload = client.post(
        "/v1/uploads",
        json={"label_epoch": "e-1", "message_id": "00000000-0000-0000-0000-000000000001", "envelope": "AA=="},
        headers=ADMIN,
    )
    assert upload.status_code == 403 and "device token" in error_message(upload)
    # the admin may use inference (operations, load tests)
    assert client.post(INFER, json=x, headers=ADMIN).status_code == 200


def test_enrolment_list_and_revocation(client):
    device = enrol(client, name="revoke-me", tier="flagship")
    assert device["server_public_key"] and len(device["token"]) >= 40
    assert device["interface_shape"] == [64, 8, 8] and device["default_version"] == "v1"
    assert device["label_epoch"] == LABEL_EPOCH and device["slot_table"] == class_slot_table().to_hex()
    assert device["limits"]["max_request_rows"] == 8
    listed = {d["device_id"]: d for d in client.get("/v1/devices", headers=ADMIN).json()}
    assert listed[device["device_id"]]["name"] == "revoke-me"
    assert "token" not in listed[device["device_id"]]
    token_auth = bearer(device["token"])
    assert client.post(INFER, json=json_infer_body(features(1)), headers=token_auth).status_code == 200
    assert client.delete(f"/v1/devices/{device['device_id']}", headers=ADMIN).status_code == 204
    revoked = client.post(INFER, json=json_infer_body(features(1)), headers=token_auth)
    assert revoked.status_code == 401 and "was revoked" in error_message(revoked)
    assert client.delete("/v1/devices/dev_unknown", headers=ADMIN).status_code == 404


def test_enrolment_validation(client):
    response = client.post("/v1/devices", json={"tier": "Not A Tier!"}, headers=ADMIN)
    assert response.status_code == 422 and error_message(response).startswith("invalid request: body.tier")
    response = client.post("/v1/devices", json={"labels": [1]}, headers=ADMIN)
    assert response.status_code == 422 and "Extra inputs are not permitted" in error_message(response)


def test_tokens_are_stored_hashed(client, device):
    db = client.app.state.harmony.store.path.read_bytes()
    wal = client.app.state.harmony.store.path.with_name("harmony.sqlite3-wal")
    stored = db + (wal.read_bytes() if wal.exists() else b"")
    assert device["token"].encode() not in stored


def test_manifest_is_served_verbatim(tmp_path, model_dir):
    manifest_text = '{"tiers": [{"name": "mid-android"}, {"name": "tiny"}],  "model_version": "v1"}\n'
    export_dir = tmp_path / "export"
    export_dir.mkdir()
    (export_dir / "backend").symlink_to(model_dir / "backend")
    (export_dir / "manifest.json").write_text(manifest_text)
    (export_dir / "manifest.sig").write_text("c2lnbmF0dXJl")
    with TestClient(create_app(make_settings(tmp_path, export_dir))) as client:
        device = enrol(client)
        assert device["manifest"] == manifest_text and device["manifest_signature"] == "c2lnbmF0dXJl"
        served = client.get("/v1/manifest", headers=bearer(device["token"]))
        assert (
            served.content == manifest_text.encode() and served.headers["content-type"] == "application/json"
        )
        assert client.get("/v1/manifest.sig", headers=bearer(device["token"])).text == "c2lnbmF0dXJl"
        # the manifest's tiers become the metric labels; others count as 'other'
        assert client.app.state.harmony.known_tiers == {"mid-android", "tiny"}


def test_p256_manifest_signature_is_served_after_enrolment(tmp_path, model_dir):
    """Android verifies P-256: GET /v1/manifest.p256.sig returns the export's file verbatim, like
    manifest.sig (same auth), and 404 with the reason when the export has none."""
    export_dir = tmp_path / "export"
    export_dir.mkdir()
    (export_dir / "backend").symlink_to(model_dir / "backend")
    (export_dir / "manifest.json").write_text('{"tiers": [{"name": "mid-android"}]}')
    (export_dir / "manifest.sig").write_text("c2lnbmF0dXJl")
    with TestClient(create_app(make_settings(tmp_path / "without", export_dir))) as client:
        device = enrol(client)
        missing = client.get("/v1/manifest.p256.sig", headers=bearer(device["token"]))
        assert missing.status_code == 404
        assert missing.json() == {
            "detail": "this server has no P-256 manifest signature (no manifest.p256.sig in the model dir)"
        }
    (export_dir / "manifest.p256.sig").write_text("cDI1Ni1zaWduYXR1cmU=")
    with TestClient(create_app(make_settings(tmp_path / "with", export_dir))) as client:
        device = enrol(client)
        served = client.get("/v1/manifest.p256.sig", headers=bearer(device["token"]))
        assert served.status_code == 200 and served.text == "cDI1Ni1zaWduYXR1cmU="
        assert served.headers["content-type"] == "text/plain; charset=utf-8"
        assert served.text == device["manifest_p256_signature"]
        assert client.get("/v1/manifest.p256.sig").status_code == 401


def test_no_manifest_is_404(client, auth):
    assert client.get("/v1/manifest", headers=auth).status_code == 404
    assert client.get("/v1/manifest.sig", headers=auth).status_code == 404
    assert client.get("/v1/manifest.p256.sig", headers=auth).status_code == 404


def test_admin_token_file_is_created_private(tmp_path, model_dir):
    settings = make_settings(tmp_path, model_dir, admin_token=None)
    app = create_app(settings)
    token_file = settings.data_dir / "admin_token"
    key_file = settings.data_dir / "server_key.x25519"
    assert token_file.stat().st_mode & 0o777 == 0o600 and key_file.stat().st_mode & 0o777 == 0o600
    assert len(key_file.read_bytes()) == 32
    assert not [p.name for p in settings.data_dir.iterdir() if p.name.startswith(".")]  # no temp files left
    with TestClient(app) as client:
        assert client.get("/v1/devices", headers=bearer(token_file.read_text())).status_code == 200
        assert client.get("/v1/devices", headers=ADMIN).status_code == 401


# ---------------------------------------------------------------- limits


def test_rate_limit_per_device(tmp_path, model_dir):
    settings = make_settings(tmp_path, model_dir, rate_limit_per_second=0.01, rate_limit_burst=2)
    with TestClient(create_app(settings)) as client:
        first, second = enrol(client, "a"), enrol(client, "b")
        path = "/v2/models/harmony-backend"
        assert [client.get(path, headers=bearer(first["token"])).status_code for _ in range(2)] == [200, 200]
        limited = client.get(path, headers=bearer(first["token"]))
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert "exceeded" in error_message(limited)
        assert client.get(path, headers=bearer(second["token"])).status_code == 200  # per device
        assert client.get("/v1/devices", headers=ADMIN).status_code == 200  # the admin is not limited


def test_body_limit_on_content_length_and_on_streamed_bytes(tmp_path, model_dir):
    with TestClient(create_app(make_settings(tmp_path, model_dir, max_body_bytes=4096))) as client:
        auth = bearer(enrol(client)["token"])
        declared = client.post(INFER, content=encode_tensor(features(1)), headers={**auth, **BINARY})
        assert declared.status_code == 413
        assert (
            error_message(declared) == "request body is 16408 bytes; the limit is 4096 bytes (max_body_bytes)"
        )

        def chunks():  # no Content-Length: chunked transfer, counted as it streams
            body = encode_tensor(features(1))
            for i in range(0, len(body), 1000):
                yield body[i : i + 1000]

        streamed = client.post(INFER, content=chunks(), headers={**auth, **BINARY})
        assert streamed.status_code == 413 and "over the limit of 4096 bytes" in error_message(streamed)
        small = client.post(INFER, content=b"HMFT", headers={**auth, **BINARY})
        assert small.status_code == 400  # under the limit: reaches the decoder


def test_full_queue_is_503_with_retry_after(tmp_path, model_dir):
    """One request occupies the worker, one waits in the queue (size 1), the third is refused."""
    app = create_app(make_settings(tmp_path, model_dir, queue_size=1, max_batch=1, retry_after_seconds=2))
    state = app.state.harmony
    release, busy = threading.Event(), threading.Event()
    execute = state.batcher._execute

    def slow_execute(jobs):
        busy.set()
        release.wait(10)
        return execute(jobs)

    state.batcher._execute = slow_execute

    async def scenario():
        state.batcher.start()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            body = encode_tensor(features(1))
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", **BINARY}
            first = asyncio.create_task(client.post(INFER, content=body, headers=headers))
            # Wait for the worker to hold the first job. Polling the queue size alone raced: it is
            # also 0 before the first request has reached the queue, so on a busy machine the
            # "refused" request could land in the queue instead.
            while not busy.is_set():
                await asyncio.sleep(0.01)
            second = asyncio.create_task(client.post(INFER, content=body, headers=headers))
            while not state.batcher.waiting():
                await asyncio.sleep(0.01)
            refused = await client.post(INFER, content=body, headers=headers)
            release.set()
            return refused, await first, await second

    try:
        refused, first, second = asyncio.run(scenario())
    finally:
        release.set()
        state.batcher.stop()
        state.store.close()
    assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
    assert "inference queue is full (1 requests waiting)" in error_message(refused)
    assert first.status_code == 200 and second.status_code == 200


def test_micro_batching_merges_concurrent_requests(tmp_path, model_dir):
    app = create_app(make_settings(tmp_path, model_dir, max_batch=32, max_wait_ms=50))
    state = app.state.harmony

    async def scenario():
        state.batcher.start()
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as client:
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", **BINARY}
            requests = [
                client.post(INFER, content=encode_tensor(features(2, seed=i)), headers=headers)
                for i in range(8)
            ]
            return await asyncio.gather(*requests)

    try:
        responses = asyncio.run(scenario())
    finally:
        state.batcher.stop()
        state.store.close()
    assert all(r.status_code == 200 for r in responses)
    batches = state.metrics.counter_value(state.metrics.batches)
    assert state.metrics.counter_value(state.metrics.inferred_rows) == 16
    assert batches < 8  # at least two requests shared a forward pass
    # each response holds its own rows, in order, despite sharing a batch
    for i, response in enumerate(responses):
        single = state.registry.default().backend(torch.from_numpy(features(2, seed=i))).detach().numpy()
        slot_scores = np.array(response.json()["outputs"][0]["data"]).reshape(2, 10)
        np.testing.assert_allclose(slot_scores, single, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- metrics and status page


def test_metrics_and_status_page(client, auth):
    client.post(INFER, json=json_infer_body(features(2), parameters={"tier": "mid-android"}), headers=auth)
    client.post(INFER, content=encode_tensor(features(1)), headers={**auth, **BINARY})  # no tier: "other"
    client.post(INFER, json={"inputs": []}, headers=auth)
    text = client.get("/metrics").text
    assert 'harmony_http_requests_total{method="POST",route="/v2/models/{name}/infer",status="200"}' in text
    assert 'route="/v2/models/{name}/infer",status="422"' in text
    assert 'harmony_fallback_rows_total{tier="mid-android"}' in text
    assert 'harmony_fallback_rows_total{tier="other"}' in text
    assert "harmony_inference_batch_rows_bucket" in text and "harmony_inference_queue_depth" in text
    assert "harmony_http_request_duration_seconds_bucket" in text
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "harmony fallback server" in page.text and "v1" in page.text and "inferred rows" in page.text


@pytest.mark.parametrize(
    "method,path,allow",
    [
        ("put", "/v1/devices", "GET, POST"),
        ("put", "/v1/devices/dev_x", "DELETE"),
        ("post", "/v2/health/live", "GET"),
        ("get", "/v2/models/harmony-backend/infer", "POST"),
        ("delete", "/v1/uploads", "POST"),
        ("patch", "/metrics", "GET, HEAD"),
        ("post", "/", "GET, HEAD"),
    ],
)
def test_wrong_method_is_405_with_every_allowed_method(client, method, path, allow):
    response = client.request(method.upper(), path, headers=ADMIN)
    assert response.status_code == 405 and response.headers["allow"] == allow
    assert f"allowed: {allow}" in error_message(response)


def test_unknown_route_is_404(client):
    assert client.get("/v3/nothing").status_code == 404


def test_two_apps_in_one_process_have_separate_metrics(tmp_path, model_dir):
    first = create_app(make_settings(tmp_path / "a", model_dir))
    second = create_app(make_settings(tmp_path / "b", model_dir))
    with TestClient(first) as a, TestClient(second) as b:
        a.get("/v2/health/live")
        assert 'route="/v2/health/live"' in a.get("/metrics").text
        assert 'route="/v2/health/live"' not in b.get("/metrics").text


def test_a_back_end_version_name_must_match_as_a_whole(tmp_path):
    """A model_version with a trailing newline is no version name (re.match with `$` took it)."""
    model_dir = make_model_dir(tmp_path, model_version="v1\n", replay_rows=0)
    with TestClient(create_app(make_settings(tmp_path, model_dir))) as client:
        listing = client.get("/v1/registry/versions", headers=ADMIN).json()
        assert [v["version"] for v in listing["versions"]] == ["imported"]
