"""The Python device runtime (harmony_mobile/device/) on a real exported .pte and the real server app.

One small export (the fp32-only `tiny` tier of a random-initialized run dir) is built once per
module; the server is the FastAPI app in process (TestClient); "server down" is an HTTP transport
that refuses every connection, exactly what httpx raises when nothing listens on the port.
"""

from __future__ import annotations

import base64
import json
import shutil

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from harmony_mobile.export.keys import encode_public_key, load_or_create_signing_key
from harmony_mobile.export.pipeline import export_run
from harmony_mobile.server import create_app
from harmony_mobile.server.services.uploads import stored_to_feature_upload

from harmony_mobile.device import (
    DeviceCredentials,
    DeviceError,
    FederationKey,
    Phone,
    QueueFullError,
    UploadQueue,
    load_front_end,
    load_manifest,
    normalize,
)
from harmony_mobile.device.label_draws import LabelDraws, feature_sample_ids
from harmony_mobile.device.phone import LABEL_DRAWS_FILE
from harmony_mobile.protocol.label_tokens import class_tokens, epoch_key
from tests.export_fixtures import FIXTURE_EPOCH, FIXTURE_SECRET, make_run_dir
from tests.helpers.fallback_server import ADMIN, enrol, make_settings

TIER = "tiny"


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("device")
    run = make_run_dir(root / "run")
    key, _ = load_or_create_signing_key(root / "keys")
    export_run(
        run, root / "export", tiers=[TIER], private_key=key, latency_runs=2, test_samples=8, progress=False
    )
    return root / "export", encode_public_key(key.public_key())


@pytest.fixture
def server(tmp_path, export):
    export_dir, _ = export
    with TestClient(create_app(make_settings(tmp_path, export_dir))) as client:
        yield client


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def make_phone(tmp_path, export, http, *, threshold: float | None = None, manifest_changes=None) -> Phone:
    export_dir, pinned = export
    manifest = {**load_manifest(export_dir, pinned), **(manifest_changes or {})}
    program = load_front_end(export_dir, manifest, TIER, "fp32")
    credentials = DeviceCredentials.from_enrolment(enrol(http, tier=TIER))
    return Phone(
        manifest=manifest,
        tier=TIER,
        program=program,
        server_url="http://testserver",
        credentials=credentials,
        federation_key=FederationKey(FIXTURE_SECRET),
        queue=UploadQueue(tmp_path / "queue"),
        threshold=threshold,  # None: the tier's calibrated threshold; else overridden to force one path
        http=http,
    )


def pixels(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 1, 28, 28)).astype(np.uint8)


# --------------------------------------------------------------------------- trust


def test_manifest_verified_with_the_pinned_key(export, tmp_path):
    export_dir, pinned = export
    manifest = load_manifest(export_dir, pinned)
    assert manifest["tiers"][0]["name"] == TIER

    other, _ = load_or_create_signing_key(tmp_path / "other-keys")
    with pytest.raises(DeviceError, match="signature"):
        load_manifest(export_dir, encode_public_key(other.public_key()))

    tampered = tmp_path / "tampered"
    shutil.copytree(export_dir, tampered)
    text = (tampered / "manifest.json").read_text()
    (tampered / "manifest.json").write_text(text.replace('"threshold":', '"threshold": 0.0, "was":', 1))
    with pytest.raises(DeviceError, match="signature"):
        load_manifest(tampered, pinned)


def test_the_servers_manifest_installs_through_the_model_store_and_runs(export, tmp_path, server):
    """The update path end to end on the real app: GET /v1/manifest + /v1/manifest.sig with the device
    token, verified under the pinned key, the artifact checked, switched to, loadable; offered again,
    nothing changes."""
    from harmony_mobile.device import ModelStore, decode_public_key, fetch_signed_manifest

    export_dir, pinned = export
    token = enrol(server, tier=TIER)["token"]
    store = ModelStore(tmp_path / "store", decode_public_key(pinned), TIER)
    signed = fetch_signed_manifest(server, token)
    assert signed[0] == (export_dir / "manifest.json").read_bytes()
    installed = store.install(*signed, lambda path: (export_dir / path).read_bytes())
    artifact = installed.manifest["tiers"][0]["artifacts"][0]
    assert artifact["verdict"] == "pass" and store.current().manifest_version == installed.manifest_version
    program = load_front_end(installed.directory, installed.manifest, TIER)
    assert program.run(normalize(pixels(2), artifact_normalization(installed.manifest)))[0].shape == (2, 10)
    assert store.install(*fetch_signed_manifest(server, token), lambda path: b"never fetched") is None


def artifact_normalization(manifest: dict) -> dict:
    return manifest["tiers"][0]["normalization"]


def test_pte_checked_against_the_manifest_before_loading(export, tmp_path):
    export_dir, pinned = export
    copy = tmp_path / "copy"
    shutil.copytree(export_dir, copy)
    manifest = load_manifest(copy, pinned)
    program = load_front_end(copy, manifest, TIER, "fp32")
    assert program.size > 0
    path = copy / manifest["tiers"][0]["artifacts"][0]["path"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DeviceError, match="does not match the signed manifest"):
        load_front_end(copy, manifest, TIER, "fp32")
    with pytest.raises(DeviceError, match="no tier"):
        load_front_end(copy, manifest, "nope", "fp32")


def test_normalization_follows_the_manifest(export):
    export_dir, pinned = export
    entry = load_manifest(export_dir, pinned)["tiers"][0]
    x = normalize(np.full((1, 28, 28), 255, dtype=np.uint8), entry["normalization"])
    mean, std = entry["normalization"]["mean"][0], entry["normalization"]["std"][0]
    assert x.shape == (1, 1, 28, 28)
    assert torch.allclose(x, torch.full_like(x, (1.0 - mean) / std))


# --------------------------------------------------------------------------- inference


def test_confident_front_end_answers_locally(tmp_path, export, server):
    phone = make_phone(tmp_path, export, server, threshold=0.0)
    result = phone.classify(pixels(1)[0])
    assert result.source == "local" and result.prediction == result.exit_prediction
    assert result.features.shape == (1, 64, 8, 8)
    assert phone.stats.local == 1 and phone.stats.infer_bytes == 0


def test_unconfident_front_end_asks_the_server(tmp_path, export, server):
    phone = make_phone(tmp_path, export, server, threshold=1.01)
    result = phone.classify(pixels(1)[0])
    assert result.source == "server", result.error
    assert result.server_version == server.app.state.harmony.registry.default().version
    # the server answered with the top slot of g(features) of exactly what the .pte produced; the
    # phone named its class with its secret (the fixture's slot table: slot c = token of class c)
    served = server.app.state.harmony.registry.default()
    top_slot = served.backend(result.features)[:, : len(served.slot_table)].argmax(1).item()
    key = epoch_key(FIXTURE_SECRET, FIXTURE_EPOCH)
    assert served.slot_table.tokens[top_slot] == class_tokens(key, [phone.class_names[result.prediction]])[0]
    assert phone.stats.infer_bytes == 8 + 4 * 4 + 4 * 64 * 8 * 8


def test_a_slot_no_class_maps_to_keeps_the_local_answer_and_says_so(tmp_path, export, server):
    phone = make_phone(tmp_path, export, server, threshold=1.01)
    version = server.app.state.harmony.registry.default().version
    phone._slot_classes[version] = [None] * 10  # as if every slot were another federation's token
    result = phone.classify(pixels(1)[0])
    assert result.source == "local_unnamed_slot" and result.prediction == result.exit_prediction
    assert "maps to none of this phone's classes" in result.error and phone.stats.unnamed_slots == 1


def test_a_version_the_phone_has_not_seen_is_decoded_from_its_metadata(tmp_path, export, server):
    phone = make_phone(tmp_path, export, server, threshold=1.01)
    known = dict(phone._slot_classes)
    phone._slot_classes.clear()  # the manifest named another version than the one serving
    result = phone.classify(pixels(1)[0])
    assert result.source == "server" and phone._slot_classes == known  # same table, read from metadata


def test_server_down_answers_with_the_local_exit(tmp_path, export, server):
    phone = make_phone(tmp_path, export, server, threshold=1.01)
    phone.connect(httpx.Client(base_url="http://testserver", transport=httpx.MockTransport(refused)))
    result = phone.classify(pixels(1)[0])
    assert result.source == "local_after_server_failure"
    assert result.prediction == result.exit_prediction and "ConnectError" in result.error
    assert phone.stats.server_failures == 1


def test_a_recalibrated_threshold_replaces_the_manifest_one(tmp_path, export, server):
    export_dir, pinned = export
    manifest = load_manifest(export_dir, pinned)
    phone = make_phone(tmp_path, export, server)
    assert phone.threshold == manifest["tiers"][0]["threshold"]
    # after on-device personalization the phone answers with its own .pte and its recalibrated tau
    program = load_front_end(export_dir, manifest, TIER, "fp32")
    phone.use_local_front_end(program, threshold=0.0, model_version="v+local-1")
    assert phone.program is program and phone.threshold == 0.0 and phone.model_version == "v+local-1"
    assert phone.classify(pixels(1)[0]).source == "local"
    phone.use_local_front_end(program, threshold=1.01, model_version="v+local-2")
    assert phone.classify(pixels(1)[0]).source == "server"
    with pytest.raises(ValueError, match="exit threshold"):
        phone.use_local_front_end(program, threshold=float("nan"), model_version="v+local-3")
    assert phone.threshold == 1.01 and phone.model_version == "v+local-2"  # a refused tau changes nothing


# --------------------------------------------------------------------------- uploads


def test_upload_is_sealed_and_carries_tokens_not_labels(tmp_path, export, server):
    phone = make_phone(tmp_path, export, server)
    _, features, _ = phone.run_front_end(pixels(3))
    (queued,) = phone.confirm(features, [1, 7, 1])
    body = json.loads(queued.body)
    assert set(body) == {"label_epoch", "message_id", "envelope"} and body["label_epoch"] == FIXTURE_EPOCH
    assert body["message_id"] == queued.message_id
    assert base64.b64decode(body["envelope"])[:4] == b"HMSE"
    assert b"label" not in base64.b64decode(body["envelope"])  # the metadata JSON is inside the ciphertext

    assert phone.flush().delivered == 1
    (upload,) = server.app.state.harmony.store.envelopes(limit_rows=100)
    opened = stored_to_feature_upload(server.app.state.harmony.server_key, upload)
    key = epoch_key(FIXTURE_SECRET, FIXTURE_EPOCH)
    assert opened.label_tokens == class_tokens(key, [phone.class_names[c] for c in (1, 7, 1)])
    assert opened.tier == TIER and opened.label_epoch == FIXTURE_EPOCH
    assert torch.equal(opened.features, features)


def test_the_lineage_upload_protections_apply_on_the_phone(tmp_path, export, server):
    manifest = load_manifest(*export)
    run = {**manifest["run"], "label_dp_epsilon": 0.5, "feature_clip": 1.0, "noise_multiplier": 2.0}
    phone = make_phone(tmp_path, export, server, manifest_changes={"run": run})
    _, features, _ = phone.run_front_end(pixels(8))
    labels = [3] * 200
    rows = torch.cat([features] * 25)
    phone.credentials.limits["max_upload_rows"] = 256
    (queued,) = phone.confirm(rows, labels, sample_ids=range(200))  # 200 samples: 200 draws
    assert phone.flush().delivered == 1
    (upload,) = server.app.state.harmony.store.envelopes(limit_rows=1000)
    opened = stored_to_feature_upload(server.app.state.harmony.server_key, upload)
    key = epoch_key(FIXTURE_SECRET, FIXTURE_EPOCH)
    kept = sum(t == class_tokens(key, [phone.class_names[3]])[0] for t in opened.label_tokens) / 200
    # randomized response at eps 0.5 over 10 classes keeps the true token with p = 0.155
    assert 0.155 - 0.1 < kept < 0.155 + 0.1
    clipped_norms = (opened.features - 0).flatten(1).norm(dim=1)
    assert not torch.allclose(opened.features, rows)  # noised
    assert clipped_norms.mean() > 10  # sigma * C * sqrt(4096) = 128 of noise on a clipped (<= 1) row


def test_label_dp_draws_once_per_sample_and_keeps_the_draw_across_uploads_and_restarts(
    tmp_path, export, server
):
    """Re-drawing randomized response at every upload would let the server average it away."""
    manifest = load_manifest(*export)
    run = {**manifest["run"], "label_dp_epsilon": 0.5}
    phone = make_phone(tmp_path, export, server, manifest_changes={"run": run})
    _, features, _ = phone.run_front_end(pixels(8))
    phone.credentials.limits["max_upload_rows"] = 256

    def tokens_of(confirming) -> list[str]:
        (queued,) = confirming.confirm(features, [3] * 8)  # default ids: the same images, the same ids
        assert confirming.flush().delivered == 1
        stored = server.app.state.harmony.store.envelopes(limit_rows=1000)
        (mine,) = [e for e in stored if e.message_id == queued.message_id]
        return list(stored_to_feature_upload(server.app.state.harmony.server_key, mine).label_tokens)

    first = tokens_of(phone)
    assert tokens_of(phone) == first  # the same samples again: the same draws
    restarted = make_phone(tmp_path, export, server, manifest_changes={"run": run})  # same queue dir
    assert tokens_of(restarted) == first
    stored = (tmp_path / "queue" / LABEL_DRAWS_FILE).stat().st_mode & 0o777
    assert stored == 0o600
    (sample,) = feature_sample_ids(features[:1])
    assert LabelDraws(tmp_path / "queue" / LABEL_DRAWS_FILE)._draws[sample][0] == 3
    restarted.confirm(features[:1], [4])  # the user confirmed another label: a new draw, for 4
    assert LabelDraws(tmp_path / "queue" / LABEL_DRAWS_FILE)._draws[sample][0] == 4


def test_server_down_then_up_flushes_each_upload_exactly_once(tmp_path, export, server):
    phone = make_phone(tmp_path, export, server)
    phone.connect(httpx.Client(base_url="http://testserver", transport=httpx.MockTransport(refused)))
    _, features, _ = phone.run_front_end(pixels(4))
    queued = [*phone.confirm(features[:2], [0, 1]), *phone.confirm(features[2:], [2, 3])]
    result = phone.flush()
    assert result.delivered == 0 and result.remaining == 2 and "ConnectError" in result.error

    # the phone process dies; a new one opens the same queue directory: nothing lost
    reopened = UploadQueue(tmp_path / "queue")
    assert [u.message_id for u in reopened.pending()] == [u.message_id for u in queued]
    assert [u.body for u in reopened.pending()] == [u.body for u in queued]
    phone.queue = reopened

    phone.connect(server)  # server up again
    result = phone.flush()
    assert (result.delivered, result.remaining, result.error) == (2, 0, None)
    envelopes = server.app.state.harmony.store.envelopes(limit_rows=100)
    assert sorted(e.message_id for e in envelopes) == sorted(u.message_id for u in queued)
    assert phone.stats.upload_rows_acknowledged == 4 and phone.stats.duplicates == 0
    assert phone.flush().delivered == 0  # nothing left to send


def test_resend_after_lost_ack_is_stored_once(tmp_path, export, server):
    """The server stored the upload but the ack was lost: the entry stays, the resend is a duplicate."""
    phone = make_phone(tmp_path, export, server)
    _, features, _ = phone.run_front_end(pixels(2))
    (queued,) = phone.confirm(features, [4, 4])

    def lost_ack(request: httpx.Request) -> httpx.Response:
        server.post(request.url.path, content=request.content, headers=dict(request.headers))
        raise httpx.ReadTimeout("ack lost", request=request)

    phone.connect(httpx.Client(base_url="http://testserver", transport=httpx.MockTransport(lost_ack)))
    assert phone.flush().remaining == 1
    phone.connect(server)
    assert phone.flush().delivered == 1
    assert phone.stats.duplicates == 1
    envelopes = server.app.state.harmony.store.envelopes(limit_rows=100)
    assert [e.message_id for e in envelopes] == [queued.message_id]


def test_permanent_refusal_moves_the_entry_aside(tmp_path, export, server):
    phone = make_phone(tmp_path, export, server)
    _, features, _ = phone.run_front_end(pixels(1))
    (queued,) = phone.confirm(features, [2])
    body = json.loads(queued.body)
    envelope = bytearray(base64.b64decode(body["envelope"]))
    envelope[-1] ^= 1  # tampered on disk: the server cannot authenticate it (400)
    body["envelope"] = base64.b64encode(bytes(envelope)).decode()
    queued.path.write_bytes(json.dumps(body).encode())
    (good,) = phone.confirm(features, [2])
    result = phone.flush()
    assert (result.delivered, result.rejected, result.remaining) == (1, 1, 0)
    assert phone.queue.rejected() == 1
    assert [e.message_id for e in server.app.state.harmony.store.envelopes(limit_rows=10)] == [
        good.message_id
    ]


def test_transient_refusal_keeps_the_entry(tmp_path, export, server):
    phone = make_phone(tmp_path, export, server)
    _, features, _ = phone.run_front_end(pixels(1))
    phone.confirm(features, [2])
    unavailable = httpx.MockTransport(lambda request: httpx.Response(503, json={"detail": "busy"}))
    phone.connect(httpx.Client(base_url="http://testserver", transport=unavailable))
    result = phone.flush()
    assert (result.delivered, result.remaining) == (0, 1) and result.error.startswith("503")


def test_queue_is_bounded_and_refuses_new_entries(tmp_path):
    queue = UploadQueue(tmp_path / "q", max_entries=2)
    first = queue.enqueue(lambda message_id: message_id.encode())
    queue.enqueue(lambda message_id: b"x")
    with pytest.raises(QueueFullError):
        queue.enqueue(lambda message_id: b"y")
    assert [u.message_id for u in queue.pending()][0] == first.message_id
    assert first.body == first.message_id.encode()  # the id handed to the body builder is the entry's id
    small = UploadQueue(tmp_path / "small", max_bytes=10)
    with pytest.raises(QueueFullError):
        small.enqueue(lambda message_id: b"0123456789A")
    assert len(small) == 0


def test_queue_entry_names_match_as_a_whole(tmp_path):
    """A name with a trailing newline is not an entry (re.match with `$` would take it)."""
    queue = UploadQueue(tmp_path / "q")
    entry = queue.enqueue(lambda message_id: b"body")
    (tmp_path / "q" / (entry.path.name + "\n")).write_bytes(b"stray")
    assert [u.path for u in queue.pending()] == [entry.path] and len(queue) == 1


def test_queue_ignores_half_written_files(tmp_path):
    queue = UploadQueue(tmp_path / "q")
    queue.enqueue(lambda message_id: b"body")
    (tmp_path / "q" / ".tmp-crashed").write_bytes(b"half")
    reopened = UploadQueue(tmp_path / "q")
    assert len(reopened) == 1 and not (tmp_path / "q" / ".tmp-crashed").exists()
    second = reopened.enqueue(lambda message_id: b"next")
    assert [u.sequence for u in reopened.pending()] == [1, second.sequence] and second.sequence == 2


def test_admin_token_cannot_upload(tmp_path, export, server):
    """Sanity of the fixture: the phone's own token is what authenticates uploads (403 for admin)."""
    phone = make_phone(tmp_path, export, server)
    _, features, _ = phone.run_front_end(pixels(1))
    (queued,) = phone.confirm(features, [0])
    response = server.post(
        "/v1/uploads", content=queued.body, headers={**ADMIN, "content-type": "application/json"}
    )
    assert response.status_code == 403
