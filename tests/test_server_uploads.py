"""Sealed uploads over HTTP: stored durably before 201, idempotent by message id, and anything
tampered, mis-bound or malformed is refused with nothing stored."""

from __future__ import annotations

import base64
import gzip
import json
import uuid
import zlib

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from harmony_mobile.server import create_app
from harmony_mobile.server.services.store import Store
from harmony_mobile.server.services.uploads import stored_to_feature_upload

from harmony_mobile.protocol.wire import UploadMetadata, encode_upload
from tests.conftest import STORE_BACKENDS, database_url_for
from tests.helpers.fallback_server import (
    ADMIN,
    LABEL_EPOCH,
    bearer,
    enrol,
    error_message,
    make_model_dir,
    make_settings,
    sealed_body,
    sealed_upload,
)

torch.set_num_threads(1)
UPLOADS = "/v1/uploads"


@pytest.fixture(scope="module", params=STORE_BACKENDS)
def client(request, tmp_path_factory):
    """Every upload test runs on both store backends: SQLite and PostgreSQL."""
    root = tmp_path_factory.mktemp("uploads")
    url = database_url_for(request.param, request)
    settings = make_settings(root, make_model_dir(root), max_upload_rows=16, database_url=url)
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture(scope="module")
def device(client):
    return enrol(client)


def stored_count(client) -> int:
    return client.app.state.harmony.store.upload_stats()["uploads"]


def post(client, device, body):
    return client.post(UPLOADS, json=body, headers=bearer(device["token"]))


def test_upload_is_stored_sealed_and_opens_to_a_feature_upload(client, device):
    before = stored_count(client)
    body = sealed_upload(device, LABEL_EPOCH, [1, 2, 1], clip_norm=3.0, noise_multiplier=0.5)
    response = post(client, device, body)
    assert response.status_code == 201, response.text
    receipt = response.json()
    assert (
        receipt["rows"] == 3 and receipt["duplicate"] is False and receipt["message_id"] == body["message_id"]
    )
    assert stored_count(client) == before + 1
    # durable: a second, independent connection sees the committed row
    state = client.app.state.harmony
    url = state.settings.database_url
    other = Store(state.settings.data_dir, url.get_secret_value() if url else None)
    try:
        stored = [e for e in other.envelopes() if e.message_id == body["message_id"]]
    finally:
        other.close()
    assert len(stored) == 1 and stored[0].envelope == base64.b64decode(body["envelope"])  # sealed at rest
    upload = stored_to_feature_upload(state.server_key, stored[0])
    assert (
        upload.client_id == device["device_id"]
        and upload.label_epoch == LABEL_EPOCH
        and upload.features.shape == (3, 64, 8, 8)
    )
    assert upload.label_tokens[0] == upload.label_tokens[2] != upload.label_tokens[1]


def test_replay_is_idempotent(client, device):
    body = sealed_upload(device, LABEL_EPOCH, [0, 1])
    first = post(client, device, body)
    count = stored_count(client)
    again = post(client, device, body)
    assert first.status_code == 201 and again.status_code == 200
    assert again.json() == {**first.json(), "duplicate": True}
    assert stored_count(client) == count


def test_reused_message_id_with_other_data_is_409(client, device):
    message_id = uuid.uuid4()
    assert (
        post(client, device, sealed_upload(device, LABEL_EPOCH, [0], message_id=message_id)).status_code
        == 201
    )
    count = stored_count(client)
    conflict = post(client, device, sealed_upload(device, LABEL_EPOCH, [3], message_id=message_id))
    assert conflict.status_code == 409 and "already used for a different envelope" in error_message(conflict)
    assert stored_count(client) == count


def test_same_message_id_on_two_devices_is_two_uploads(client, device):
    other = enrol(client, "second")
    message_id = uuid.uuid4()
    assert (
        post(client, device, sealed_upload(device, LABEL_EPOCH, [0], message_id=message_id)).status_code
        == 201
    )
    assert (
        post(client, other, sealed_upload(other, LABEL_EPOCH, [0], message_id=message_id)).status_code == 201
    )


def flip(envelope_b64: str, index: int) -> str:
    raw = bytearray(base64.b64decode(envelope_b64))
    raw[index] ^= 0x01
    return base64.b64encode(bytes(raw)).decode()


@pytest.mark.parametrize("index", [0, 4, 5, 36, 37, 48, 49, 200, -17, -1], ids=lambda i: f"byte{i}")
def test_tampered_envelope_is_400_and_stores_nothing(client, device, index):
    body = sealed_upload(device, LABEL_EPOCH, [1, 2])
    count = stored_count(client)
    response = post(client, device, {**body, "envelope": flip(body["envelope"], index)})
    assert response.status_code == 400 and "sealed envelope rejected" in error_message(response)
    assert stored_count(client) == count
    assert post(client, device, body).status_code == 201  # the untouched original still goes through


@pytest.mark.parametrize("field", ["label_epoch", "message_id", "device"])
def test_envelope_bound_to_other_metadata_is_400(client, device, field):
    body = sealed_upload(device, LABEL_EPOCH, [1])
    count = stored_count(client)
    if field == "label_epoch":
        body = {**body, "label_epoch": "e-another-epoch"}
    elif field == "message_id":
        body = {**body, "message_id": str(uuid.uuid4())}
    else:  # another enrolled device replays a captured envelope under its own token
        device = enrol(client, "thief")
    response = post(client, device, body)
    assert response.status_code == 400 and "failed authentication" in error_message(response)
    assert stored_count(client) == count


def test_envelope_sealed_to_another_key_is_400(client, device):
    from harmony_mobile.protocol.sealing import generate_private_key, public_key_bytes

    other_key = public_key_bytes(generate_private_key())
    body = sealed_upload(
        {**device, "server_public_key": base64.b64encode(other_key).decode()}, LABEL_EPOCH, [1]
    )
    assert post(client, device, body).status_code == 400


def meta(rows: int) -> UploadMetadata:
    return UploadMetadata(
        label_tokens=tuple("00" * 8 for _ in range(rows)),
        split_depths=(1,) * rows,
        family="cnn",
        tier="entry-android",
        model_version="v",
    )


@pytest.mark.parametrize(
    "plaintext,status,message",
    [
        (b"not an upload payload", 400, "upload payload is malformed: upload payload magic"),
        (
            encode_upload(meta(1), np.zeros((1, 64, 8, 8), np.float32))[:-8],
            400,
            "binary tensor header promises",
        ),
        (encode_upload(meta(1), np.zeros((1, 32, 8, 8), np.float32)), 422, "expected [N, 64, 8, 8]"),
        (
            encode_upload(meta(17), np.zeros((17, 64, 8, 8), np.float32)),
            422,
            "upload has 17 rows; the limit is 16",
        ),
        (encode_upload(meta(1), np.full((1, 64, 8, 8), np.nan, np.float32)), 422, "NaN or Inf"),
    ],
)
def test_bad_plaintext_is_refused_and_stores_nothing(client, device, plaintext, status, message):
    count = stored_count(client)
    response = post(client, device, sealed_body(device, plaintext))
    assert response.status_code == status and message in error_message(response)
    assert stored_count(client) == count


@pytest.mark.parametrize(
    "body,status,message",
    [
        (
            {"label_epoch": "e-1", "message_id": str(uuid.uuid4()), "envelope": "%%%not base64"},
            400,
            "not valid base64",
        ),
        (
            {"label_epoch": "bad epoch!", "message_id": str(uuid.uuid4()), "envelope": "AAAA"},
            422,
            "body.label_epoch",
        ),
        ({"label_epoch": 3, "message_id": str(uuid.uuid4()), "envelope": "AAAA"}, 422, "body.label_epoch"),
        (
            {"label_epoch": "e" * 65, "message_id": str(uuid.uuid4()), "envelope": "AAAA"},
            422,
            "body.label_epoch",
        ),
        ({"label_epoch": "e-1", "message_id": "not-a-uuid", "envelope": "AAAA"}, 422, "body.message_id"),
        (
            {"label_epoch": "e-1", "message_id": str(uuid.UUID(int=0)), "envelope": "AAAA"},
            422,
            "the nil UUID is not a fresh message id",
        ),
        ({"label_epoch": "e-1", "message_id": str(uuid.uuid4())}, 422, "body.envelope: Field required"),
        (
            {"label_epoch": "bad epoch!", "message_id": str(uuid.uuid4()), "envelope": "AAAA"},
            422,
            "body.label_epoch",
        ),
        ({"label_epoch": "e-1", "message_id": "not-a-uuid", "envelope": "AAAA"}, 422, "body.message_id"),
        ({"label_epoch": "e-1", "message_id": str(uuid.uuid4())}, 422, "body.envelope: Field required"),
        (
            {"label_epoch": "e-1", "message_id": str(uuid.uuid4()), "envelope": "AAAA", "labels": [1]},
            422,
            "body.labels",
        ),
        (
            {"label_epoch": "e-1", "message_id": str(uuid.uuid4()), "envelope": "AAAA"},
            400,
            "shorter than the minimum",
        ),
    ],
)
def test_bad_request_bodies(client, device, body, status, message):
    count = stored_count(client)
    response = post(client, device, body)
    assert response.status_code == status and message in error_message(response)
    assert stored_count(client) == count


def test_uppercase_message_id_is_the_same_message(client, device):
    message_id = uuid.uuid4()
    body = sealed_upload(device, LABEL_EPOCH, [2], message_id=message_id)
    assert post(client, device, body).status_code == 201
    assert post(client, device, {**body, "message_id": str(message_id).upper()}).status_code == 200


def test_upload_counters(client, device):
    post(client, device, sealed_upload(device, LABEL_EPOCH, [1]))
    text = client.get("/metrics").text
    assert 'harmony_uploads_total{outcome="accepted"}' in text
    assert 'harmony_uploads_total{outcome="rejected"}' in text
    assert "harmony_upload_envelope_bytes_total" in text
    assert client.get("/v1/devices", headers=ADMIN).status_code == 200


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"model_version": "v9"}, "model_version 'v9' is not a registered version (known: v1)"),
        ({"model_version": "v9+local-1"}, "model_version 'v9+local-1' is not a registered version"),
        ({"tier": "flagship", "family": "resnet"}, "upload tier 'flagship' is not the tier 'mid-android'"),
        ({"family": "cnn"}, "family 'cnn' does not match tier 'mid-android' (expected mobilenet)"),
        (
            {"split_depths": (99,)},
            "split_depths holds 99; tier 'mid-android' extracts every row at split depth 2",
        ),
        (
            {"split_depths": (1,)},
            "split_depths holds 1; tier 'mid-android' extracts every row at split depth 2",
        ),
        ({"noise_multiplier": 0.5}, "noise_multiplier needs clip_norm"),
    ],
)
def test_upload_metadata_must_match_the_registry_and_the_enrolled_device(client, device, changes, message):
    count = stored_count(client)
    response = post(client, device, sealed_upload(device, LABEL_EPOCH, [1], **changes))
    assert response.status_code == 422 and message in error_message(response)
    assert stored_count(client) == count


def test_upload_label_epoch_must_be_the_named_versions(client, device):
    """The envelope authenticates any epoch it was sealed with; the server also holds the epoch to
    the lineage of the front-end version the rows name."""
    count = stored_count(client)
    response = post(client, device, sealed_upload(device, "e-another-epoch", [1, 2]))
    assert response.status_code == 422, response.text
    assert error_message(response) == (
        f"label_epoch 'e-another-epoch' is not the label epoch {LABEL_EPOCH!r} of model_version 'v1'"
    )
    assert stored_count(client) == count


def test_non_finite_protection_parameters_are_refused(client, device):
    """Python's json reads the non-JSON literal Infinity; an infinite clip protects nothing."""
    good = encode_upload(meta(1), np.zeros((1, 64, 8, 8), np.float32))
    length = int.from_bytes(good[5:9], "little")
    document = good[9 : 9 + length].decode()[:-1] + ',"clip_norm":Infinity}'
    plaintext = good[:5] + len(document).to_bytes(4, "little") + document.encode() + good[9 + length :]
    response = post(client, device, sealed_body(device, plaintext))
    assert response.status_code == 400 and "clip_norm: Input should be a finite number" in error_message(
        response
    )


def test_a_personalized_build_of_a_registered_version_is_accepted(client, device):
    response = post(client, device, sealed_upload(device, LABEL_EPOCH, [1], model_version="v1+local-1"))
    assert response.status_code == 201


def test_a_device_enrolled_without_tier_may_upload_any_known_tier(client):
    response = client.post("/v1/devices", json={"name": "no-tier"}, headers=ADMIN)
    device = response.json()
    assert (
        post(
            client, device, sealed_upload(device, LABEL_EPOCH, [1], tier="flagship", family="resnet")
        ).status_code
        == 201
    )
    unknown = post(client, device, sealed_upload(device, LABEL_EPOCH, [1], tier="toaster", family="cnn"))
    assert unknown.status_code == 422 and "unknown tier 'toaster'" in error_message(unknown)


def test_without_any_registered_version_uploads_are_refused(tmp_path):
    with TestClient(create_app(make_settings(tmp_path, None))) as client:
        device = enrol(client)
        response = post(client, device, sealed_upload(device, LABEL_EPOCH, [1, 2]))
        assert response.status_code == 422 and "(known: none)" in error_message(response)
        assert stored_count(client) == 0


def test_uploads_are_accepted_before_any_backend_is_loaded(tmp_path):
    """A server with a manifest but no back-end still collects uploads of the manifest's version,
    held to the project's 64x8x8 interface."""
    export_dir = tmp_path / "export"
    export_dir.mkdir()
    manifest = {"model_version": "v1", "tiers": [{"name": "mid-android", "family": "mobilenet"}]}
    (export_dir / "manifest.json").write_text(json.dumps(manifest))
    with TestClient(create_app(make_settings(tmp_path, export_dir))) as client:
        device = enrol(client)
        assert post(client, device, sealed_upload(device, LABEL_EPOCH, [1, 2])).status_code == 201
        wrong = sealed_body(device, encode_upload(meta(1), np.zeros((1, 32, 8, 8), np.float32)))
        response = post(client, device, wrong)
        assert response.status_code == 422 and "expected [N, 64, 8, 8]" in error_message(response)
        assert stored_count(client) == 1


def test_the_manifests_tier_depth_and_label_epoch_are_what_uploads_are_held_to(tmp_path):
    export_dir = tmp_path / "export"
    export_dir.mkdir()
    manifest = {
        "model_version": "v1",
        "label_epoch": "e-manifest",
        "tiers": [{"name": "mid-android", "family": "mobilenet", "split_depth": 3}],
    }
    (export_dir / "manifest.json").write_text(json.dumps(manifest))
    with TestClient(create_app(make_settings(tmp_path, export_dir))) as client:
        device = enrol(client)
        refused = post(client, device, sealed_upload(device, "e-manifest", [1]))
        assert refused.status_code == 422
        assert "tier 'mid-android' extracts every row at split depth 3" in error_message(refused)
        other_epoch = post(client, device, sealed_upload(device, LABEL_EPOCH, [1], split_depths=(3,)))
        assert other_epoch.status_code == 422 and "label epoch 'e-manifest'" in error_message(other_epoch)
        assert (
            post(client, device, sealed_upload(device, "e-manifest", [1], split_depths=(3,))).status_code
            == 201
        )
        unknown = client.post("/v1/devices", json={"tier": "flagship"}, headers=ADMIN)
        assert unknown.status_code == 422
        assert error_message(unknown) == "tier 'flagship' is not a tier of this server (known: mid-android)"


@pytest.mark.parametrize(
    "method,path,role",
    [
        ("POST", "/v1/uploads", "device"),
        ("POST", "/v1/devices", "admin"),
        ("POST", "/v1/alignment/rounds", "admin"),
        ("PUT", "/v1/registry/default", "admin"),
    ],
)
@pytest.mark.parametrize("content", [b"{", b"\xff\xfe not utf-8"], ids=["truncated", "not-utf8"])
def test_the_token_is_checked_before_a_body_that_is_not_json(client, device, method, path, role, content):
    """docs/PROTOCOL.md 4.5 step 1: 401 / 403 come before the body is parsed."""
    json_type = {"content-type": "application/json"}
    missing = client.request(method, path, content=content, headers=json_type)
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    wrong = ADMIN if role == "device" else bearer(device["token"])
    assert client.request(method, path, content=content, headers={**json_type, **wrong}).status_code == 403
    right = bearer(device["token"]) if role == "device" else ADMIN
    response = client.request(method, path, content=content, headers={**json_type, **right})
    assert response.status_code == 422 and "JSON decode error" in error_message(response)


def encoded_post(client, device, content: bytes, encoding: str):
    headers = {**bearer(device["token"]), "content-type": "application/json", "content-encoding": encoding}
    return client.post(UPLOADS, content=content, headers=headers)


@pytest.mark.parametrize("encoding,compress", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_a_compressed_upload_body_is_decoded(client, device, encoding, compress):
    body = sealed_upload(device, LABEL_EPOCH, [1, 2])
    response = encoded_post(client, device, compress(json.dumps(body).encode()), encoding)
    assert response.status_code == 201, response.text
    assert response.json()["message_id"] == body["message_id"] and response.json()["rows"] == 2


def test_an_unsupported_content_encoding_is_415_and_stores_nothing(client, device):
    count = stored_count(client)
    response = encoded_post(
        client, device, json.dumps(sealed_upload(device, LABEL_EPOCH, [1])).encode(), "br"
    )
    assert response.status_code == 415
    assert error_message(response) == "Content-Encoding 'br' is not supported; use gzip, deflate or none"
    assert stored_count(client) == count


def plaintext_with_metadata(document: dict) -> bytes:
    """An upload plaintext whose metadata JSON is `document` as written, bypassing the model."""
    encoded = json.dumps(document, separators=(",", ":")).encode()
    features = encode_upload(meta(1), np.zeros((1, 64, 8, 8), np.float32))
    start = 9 + int.from_bytes(features[5:9], "little")
    return features[:5] + len(encoded).to_bytes(4, "little") + encoded + features[start:]


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"split_depths": ["2"]}, "split_depths.0"),
        ({"split_depths": [True]}, "split_depths.0"),
        ({"clip_norm": "1.0"}, "clip_norm"),
        ({"clip_norm": True}, "clip_norm"),
        ({"clip_norm": 1.0, "noise_multiplier": "0.5"}, "noise_multiplier"),
        ({"label_dp_epsilon": "2"}, "label_dp_epsilon"),
        ({"label_dp_epsilon": True}, "label_dp_epsilon"),
    ],
)
def test_metadata_numbers_of_the_wrong_type_are_400(client, device, changes, field):
    """Conventions and 4.5 step 5: a number is a JSON number, never a string or a boolean."""
    count = stored_count(client)
    document = {
        "label_tokens": ["00" * 8],
        "split_depths": [2],
        "family": "mobilenet",
        "tier": device.get("tier") or "mid-android",
        "model_version": "v1",
        **changes,
    }
    response = post(client, device, sealed_body(device, plaintext_with_metadata(document)))
    assert response.status_code == 400, response.text
    assert f"{field}: must be a JSON number, not a string or a boolean" in error_message(response)
    assert stored_count(client) == count


def test_metadata_integers_and_floats_may_be_any_json_number(client, device):
    document = {
        "label_tokens": ["00" * 8],
        "split_depths": [2.0],
        "family": "mobilenet",
        "tier": device.get("tier") or "mid-android",
        "model_version": "v1",
        "clip_norm": 1,
        "noise_multiplier": 0,
        "label_dp_epsilon": 2,
    }
    response = post(client, device, sealed_body(device, plaintext_with_metadata(document)))
    assert response.status_code == 201, response.text
