"""Alignment rounds and the model registry: publish, reject, crash mid-round, restart, hot swap,
set default and roll back. Training is small (tens of steps on a few hundred rows)."""

from __future__ import annotations

import base64
import hashlib
import shutil
import threading
import time
from contextlib import contextmanager

import harmony_mobile.server.services.alignment as alignment_module
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from harmony_mobile.server import create_app
from harmony_mobile.server.services.alignment import SlotRows, slot_accuracy
from harmony_mobile.server.services.store import NewUpload

from harmony_mobile.protocol.messages import FeatureUpload
from harmony_mobile.protocol.slots import SlotTable
from harmony_mobile.run_dir import load_backend_file
from tests.conftest import STORE_BACKENDS, database_url_for
from tests.helpers.fallback_server import (
    ADMIN,
    INTERFACE,
    LABEL_EPOCH,
    bearer,
    class_features,
    enrol,
    error_message,
    json_infer_body,
    make_model_dir,
    make_settings,
    sealed_upload,
)

torch.set_num_threads(1)
ROUNDS = "/v1/alignment/rounds"
INFER = "/v2/models/harmony-backend/infer"
FAST = {"steps": 12, "batch_size": 32}
LEASE = 2.0  # short, so a test sees an expired lease quickly
# A round that must stay alive: its heartbeat renews every LIVE_LEASE / 3 s, so a renewal may come
# 4 s late before the lease lapses; with LEASE a loaded machine (2 cores, another test worker writing
# the same disk, every SQLite commit fsynced) once delayed one past it.
LIVE_LEASE = 6.0


def store_uploads(client, device, uploads: int = 4, rows: int = 30, label_epoch: str = LABEL_EPOCH) -> None:
    for i in range(uploads):
        classes = (np.arange(rows) + i) % 10
        body = sealed_upload(device, label_epoch, classes, seed=i)
        assert client.post("/v1/uploads", json=body, headers=bearer(device["token"])).status_code == 201


def store_other_lineage(client, device, uploads: int = 2, rows: int = 30) -> None:
    """Rows of another lineage, stored while that lineage was served. The API refuses an epoch that
    is not the named version's, and this server knows only v1, so they go straight into the store,
    sealed as a phone seals them."""
    store = client.app.state.harmony.store
    for i in range(uploads):
        body = sealed_upload(device, "e-another-lineage", (np.arange(rows) + i) % 10, seed=i)
        envelope = base64.b64decode(body["envelope"])
        upload = NewUpload(
            device_id=device["device_id"],
            message_id=body["message_id"],
            label_epoch=body["label_epoch"],
            envelope=envelope,
            envelope_sha256=hashlib.sha256(envelope).hexdigest(),
            rows=rows,
            tier="mid-android",
            family="mobilenet",
            model_version="v0",
            clip_norm=None,
            noise_multiplier=None,
        )
        assert store.add_upload(upload)[1]


def wait_for_round(client, round_id: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = client.get(f"{ROUNDS}/{round_id}", headers=ADMIN).json()
        if record["status"] not in ("queued", "running"):
            return record
        time.sleep(0.05)
    raise AssertionError(f"round {round_id} did not finish: {record}")


def infer_version(client, device) -> tuple[str, list[float]]:
    body = client.post(
        INFER, json=json_infer_body(class_features(np.array([4]), 99)), headers=bearer(device["token"])
    ).json()
    return body["model_version"], body["outputs"][0]["data"]


@pytest.fixture(scope="module")
def fitted_model_dir(tmp_path_factory):
    """A back-end with confident, class-dependent predictions (a random one is near-uniform, so any
    update flips its argmax and every round would be rejected)."""
    return make_model_dir(tmp_path_factory.mktemp("fitted"), fit_steps=20)


@contextmanager
def running_server(request, tmp_path, fitted_model_dir, **overrides):
    """SQLite unless the test parametrizes the fixture (indirect) with "postgresql"."""
    model_dir = tmp_path / "model"
    shutil.copytree(fitted_model_dir, model_dir)
    url = database_url_for(getattr(request, "param", "sqlite"), request)
    settings = make_settings(tmp_path, model_dir, database_url=url, **overrides)
    with TestClient(create_app(settings)) as client:
        device = enrol(client)
        store_uploads(client, device)
        store_other_lineage(client, device)  # never used: other epoch
        yield client, device, settings


@pytest.fixture
def server(request, tmp_path, fitted_model_dir):
    with running_server(request, tmp_path, fitted_model_dir) as started:
        yield started


@pytest.fixture
def leased_server(request, tmp_path, fitted_model_dir):
    """Rounds leased for LEASE seconds, so an expired lease is seen within a test."""
    with running_server(request, tmp_path, fitted_model_dir, round_lease_seconds=LEASE) as started:
        yield started


@pytest.fixture
def live_leased_server(request, tmp_path, fitted_model_dir):
    """Rounds leased for LIVE_LEASE seconds: a slow write does not let a live one lapse."""
    with running_server(request, tmp_path, fitted_model_dir, round_lease_seconds=LIVE_LEASE) as started:
        yield started


@pytest.mark.parametrize("server", STORE_BACKENDS, indirect=True)
def test_round_publishes_a_new_default_version(server):
    client, device, _ = server
    old_version, old_logits = infer_version(client, device)
    accepted = client.post(ROUNDS, json=FAST, headers=ADMIN)
    assert accepted.status_code == 202 and accepted.json()["status"] in ("queued", "running")
    record = wait_for_round(client, accepted.json()["id"])
    assert record["status"] == "published", record["metrics"]
    assert record["progress"] == 1.0 and record["parent_version"] == "v1" and record["new_version"] == "v1-r1"
    metrics = record["metrics"]
    assert metrics["rows"] == 120 and metrics["holdout_rows"] == 24 and metrics["step"] == 12
    assert (metrics["replay_rows"], metrics["replay_shipped_rows"], metrics["replay_stored_rows"]) == (
        200,
        200,
        0,
    )
    assert metrics["replay_holdout_rows"] == 40 and metrics["distillation"] == "on replay rows"
    assert metrics["replay_check"] == "passed" and metrics["replay_agreement"] >= 0.9
    assert metrics["holdout_slot_accuracy_after"] >= metrics["holdout_slot_accuracy_before"]
    assert metrics["slots_before"] == metrics["slots_after"] == 10 and metrics["rows_without_slot"] == 0
    registry = client.get("/v1/registry/versions", headers=ADMIN).json()
    assert registry["default"] == "v1-r1"
    assert [(v["version"], v["parent"], v["source"]) for v in registry["versions"]] == [
        ("v1", None, "import"),
        ("v1-r1", "v1", "alignment"),
    ]
    new_version, new_logits = infer_version(client, device)
    assert (old_version, new_version) == ("v1", "v1-r1") and new_logits != old_logits
    assert client.get(ROUNDS, headers=ADMIN).json()[0]["id"] == record["id"]
    sha = registry["versions"][1]["sha256"]
    artifacts = client.app.state.harmony.registry.artifacts
    assert (artifacts / f"{sha}.pt").is_file()  # content-addressed
    parent = load_backend_file(artifacts / f"{registry['versions'][0]['sha256']}.pt")
    assert torch.equal(load_backend_file(artifacts / f"{sha}.pt").replay, parent.replay)  # inherited
    assert 'harmony_alignment_rounds_total{status="published"} 1.0' in client.get("/metrics").text


def count_supcon_calls(monkeypatch) -> list[int]:
    real, calls = alignment_module.supcon_loss, []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(alignment_module, "supcon_loss", counted)
    return calls


def test_supcon_is_neither_computed_nor_reported_by_default(server, monkeypatch):
    client, _, _ = server
    calls = count_supcon_calls(monkeypatch)
    record = wait_for_round(client, client.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"])
    assert record["status"] == "published" and record["metrics"]["step"] == 12
    assert "supcon" not in record["metrics"] and calls == []


def test_a_round_that_weights_supcon_trains_and_reports_it(server, monkeypatch):
    client, _, _ = server
    calls = count_supcon_calls(monkeypatch)
    weighted = FAST | {"contrastive_weight": 0.5}
    record = wait_for_round(client, client.post(ROUNDS, json=weighted, headers=ADMIN).json()["id"])
    assert record["metrics"]["step"] == 12 and len(calls) == 12 and record["metrics"]["supcon"] > 0


def test_round_that_would_change_the_class_mapping_is_rejected(server):
    """A large step without distillation moves the back-end far from its slot mapping on the replay
    rows: the replay check stops it."""
    client, device, _ = server
    params = {**FAST, "steps": 30, "learning_rate": 0.3, "distill_weight": 0.0}
    record = wait_for_round(client, client.post(ROUNDS, json=params, headers=ADMIN).json()["id"])
    assert record["status"] == "rejected", record
    metrics = record["metrics"]
    assert metrics["replay_check"] == "failed" and metrics["replay_agreement"] < 0.5
    assert "held-out replay agreement" in metrics["rejected_because"] and record["new_version"] is None
    assert metrics["distillation"] == "off: distill_weight 0"
    assert client.get("/v1/registry/versions", headers=ADMIN).json()["default"] == "v1"
    assert infer_version(client, device)[0] == "v1"


DRIFTED_CLASS = 7


def drifted_features(rows: int, seed: int) -> np.ndarray:
    """A drifted phone's features of DRIFTED_CLASS: far from every class the back-end was fitted to."""
    centre = np.random.default_rng(999).standard_normal(INTERFACE.shape).astype(np.float32)
    noise = 0.5 * np.random.default_rng(seed).standard_normal((rows, *INTERFACE.shape)).astype(np.float32)
    return np.maximum(centre + noise, 0).astype(np.float32)


def served_predictions(client, version: str, features: np.ndarray) -> np.ndarray:
    model = client.app.state.harmony.registry.get(version)
    with torch.no_grad():
        return model.backend(torch.from_numpy(features)).argmax(1).numpy()


def test_round_fixes_rows_the_current_version_gets_wrong_and_keeps_the_replay_mapping(server):
    """The docs/ALGORITHM.md round: a drifted phone's rows of one class (one token group, together with
    other phones' rows of that class) are misclassified by the current version. SupCon on the new
    rows pulls them to their group; distillation on the replay rows keeps the mapping, so the group
    lands on the class the other phones' rows already had. Distilling on the new rows themselves
    (the earlier code) kept them wrong and the round was rejected."""
    client, device, _ = server
    body = sealed_upload(
        device, LABEL_EPOCH, np.full(40, DRIFTED_CLASS), features=drifted_features(40, seed=5)
    )
    assert client.post("/v1/uploads", json=body, headers=bearer(device["token"])).status_code == 201
    unseen = drifted_features(100, seed=77)  # never uploaded
    replay = client.app.state.harmony.registry.default().replay.float().numpy()
    before_unseen = served_predictions(client, "v1", unseen)
    assert (before_unseen == DRIFTED_CLASS).mean() < 0.2, np.bincount(before_unseen, minlength=10)

    record = wait_for_round(client, client.post(ROUNDS, json={}, headers=ADMIN).json()["id"])
    assert record["status"] == "published", record
    metrics = record["metrics"]
    assert metrics["rows"] == 160 and metrics["replay_check"] == "passed"
    assert metrics["holdout_slot_accuracy_after"] > metrics["holdout_slot_accuracy_before"] + 0.1
    after_unseen = served_predictions(client, record["new_version"], unseen)
    assert (after_unseen == DRIFTED_CLASS).mean() > 0.8, np.bincount(after_unseen, minlength=10)
    kept = served_predictions(client, record["new_version"], replay) == served_predictions(
        client, "v1", replay
    )
    assert kept.mean() >= 0.95 and metrics["replay_agreement"] >= 0.95


def test_round_with_no_replay_rows_says_so(tmp_path):
    model_dir = make_model_dir(tmp_path, fit_steps=20, replay_rows=0)  # a back-end file without a replay set
    with TestClient(create_app(make_settings(tmp_path, model_dir))) as client:
        device = enrol(client)
        store_uploads(client, device)
        record = wait_for_round(client, client.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"])
        assert record["status"] == "rejected" and record["new_version"] is None, record
        metrics = record["metrics"]
        assert metrics["replay_rows"] == 0 and metrics["replay_check"] == "impossible: no replay rows"
        assert metrics["distillation"] == "off: no replay rows" and "step" not in metrics  # did not train
        assert metrics["rejected_because"].startswith("no replay rows (0)")
        assert client.get("/v1/registry/versions", headers=ADMIN).json()["default"] == "v1"

        allowed = {**FAST, "require_replay": False}
        record = wait_for_round(client, client.post(ROUNDS, json=allowed, headers=ADMIN).json()["id"])
        metrics = record["metrics"]
        kept = metrics["holdout_slot_accuracy_after"] >= metrics["holdout_slot_accuracy_before"]
        assert record["status"] == ("published" if kept else "rejected"), metrics  # slot accuracy alone
        assert metrics["replay_rows"] == 0 and metrics["distillation"] == "off: no replay rows"
        assert metrics["replay_check"] == "skipped: no replay rows (require_replay=false)"
        assert "replay_agreement" not in metrics and metrics["step"] == FAST["steps"]


def test_next_round_replays_the_rows_the_current_version_was_trained_on(server):
    client, device, _ = server
    first = wait_for_round(client, client.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"])
    assert first["status"] == "published" and first["metrics"]["trained_through_upload_id"] == 4
    second = wait_for_round(client, client.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"])
    assert second["status"] == "failed" and "at least 16 new stored rows, found 0" in second["error"]
    store_uploads(client, device, uploads=2)
    third = wait_for_round(client, client.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"])
    assert third["status"] == "published" and third["parent_version"] == "v1-r1", third
    metrics = third["metrics"]
    assert metrics["rows"] == 60 and metrics["trained_through_upload_id"] == 8  # 5, 6: the other epoch's
    assert (metrics["replay_rows"], metrics["replay_shipped_rows"], metrics["replay_stored_rows"]) == (
        320,
        200,
        120,
    )


def test_round_params_are_validated(server):
    client, _, _ = server
    response = client.post(ROUNDS, json={"steps": 0}, headers=ADMIN)
    assert response.status_code == 422 and "body.steps" in error_message(response)
    assert client.get(f"{ROUNDS}/999", headers=ADMIN).status_code == 404


def test_too_few_rows_fails_the_round(tmp_path):
    with TestClient(create_app(make_settings(tmp_path, make_model_dir(tmp_path)))) as client:
        device = enrol(client)
        store_uploads(client, device, uploads=1, rows=5)
        record = wait_for_round(client, client.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"])
        assert record["status"] == "failed" and "at least 16 new stored rows, found 5" in record["error"]


def test_crash_mid_round_keeps_old_version_and_uploads(server, monkeypatch):
    client, device, _ = server
    uploads_before = client.app.state.harmony.store.upload_stats()
    calls = 0
    real = alignment_module.distillation_loss

    def crashing(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 5:
            raise RuntimeError("simulated crash in step 5")
        return real(*args, **kwargs)

    monkeypatch.setattr(alignment_module, "distillation_loss", crashing)
    record = wait_for_round(client, client.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"])
    assert record["status"] == "failed" and record["error"] == "RuntimeError: simulated crash in step 5"
    assert 0 < record["progress"] < 1
    assert client.get("/v1/registry/versions", headers=ADMIN).json()["default"] == "v1"
    assert infer_version(client, device)[0] == "v1"
    assert client.app.state.harmony.store.upload_stats() == uploads_before
    monkeypatch.setattr(alignment_module, "distillation_loss", real)
    assert (
        wait_for_round(client, client.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"])["status"]
        == "published"
    )


def block_round_at_step(monkeypatch, step: int, then_fail: bool = True):
    """Hold the round inside training at `step` until `release` is set; then fail it (a dead
    process) or, with `then_fail=False`, let it go on."""
    reached, release = threading.Event(), threading.Event()
    real = alignment_module._slot_losses
    calls = 0

    def blocking(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == step + 1:  # one call per training step, from step 0
            reached.set()
            release.wait(60)
            if then_fail:
                raise RuntimeError("the process died here")
        return real(*args, **kwargs)

    monkeypatch.setattr(alignment_module, "_slot_losses", blocking)
    return reached, release


def wait_for_status(client, round_id: int, status: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = client.get(f"{ROUNDS}/{round_id}", headers=ADMIN).json()
        if record["status"] == status:
            return record
        time.sleep(0.1)
    raise AssertionError(f"round {round_id} did not become {status}: {record}")


@pytest.mark.parametrize("leased_server", STORE_BACKENDS, indirect=True)
def test_restart_during_a_round_marks_it_interrupted_and_loses_nothing(leased_server, monkeypatch):
    client, device, settings = leased_server
    reached, release = block_round_at_step(monkeypatch, step=3)
    round_id = client.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"]
    assert reached.wait(30)
    # The old process freezes mid-round, as after a kill -9: its heartbeat renews nothing any more.
    monkeypatch.setattr(client.app.state.harmony.alignment, "beat", lambda: None)
    uploads = client.app.state.harmony.store.upload_stats()
    try:
        # a new process on the same store; the round it runs below must not lapse on a slow write
        restarted_settings = settings.model_copy(update={"round_lease_seconds": LIVE_LEASE})
        with TestClient(create_app(restarted_settings)) as restarted:
            record = wait_for_status(restarted, round_id, "interrupted", timeout=6 * LEASE)
            assert "stopped while this round" in record["error"]
            assert restarted.app.state.harmony.store.upload_stats() == uploads
            assert restarted.get("/v1/registry/versions", headers=ADMIN).json()["default"] == "v1"
            assert infer_version(restarted, device)[0] == "v1"
            assert restarted.get("/v2/health/ready").json() == {"ready": True}
            release.set()  # the stale worker wakes up and dies: it must not overwrite 'interrupted'
            time.sleep(0.3)
            assert restarted.get(f"{ROUNDS}/{round_id}", headers=ADMIN).json()["status"] == "interrupted"
            monkeypatch.undo()
            fresh = wait_for_round(restarted, restarted.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"])
            assert fresh["status"] == "published"
    finally:
        release.set()


@pytest.mark.parametrize("live_leased_server", STORE_BACKENDS, indirect=True)
def test_a_worker_starting_beside_a_live_round_leaves_it_running(live_leased_server, monkeypatch):
    """`--workers N` or replicas: a process starting (or restarting) while another one runs a round
    does not interrupt that round, and a round it queues waits until the live one is done."""
    client, device, settings = live_leased_server
    reached, release = block_round_at_step(monkeypatch, step=2, then_fail=False)
    round_id = client.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"]
    assert reached.wait(30)
    try:
        with TestClient(create_app(settings)) as other:
            queued = other.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"]
            store_uploads(other, device, uploads=2)  # new rows for the queued round
            time.sleep(LIVE_LEASE)  # three heartbeats and sweeps of each process
            other.app.state.harmony.alignment.beat()  # and one sweep surely after the first lease ran out
            assert other.get(f"{ROUNDS}/{round_id}", headers=ADMIN).json()["status"] == "running"
            assert other.get(f"{ROUNDS}/{queued}", headers=ADMIN).json()["status"] == "queued"
            release.set()
            first = wait_for_round(other, round_id)
            assert first["status"] == "published" and first["new_version"] == "v1-r1"
            second = wait_for_round(other, queued)
            assert second["status"] == "published" and second["parent_version"] == "v1-r1"
    finally:
        release.set()


def test_shutdown_during_a_round_marks_it_interrupted(tmp_path, monkeypatch):
    """A graceful stop asks the running round to stop at its next step; it ends `interrupted`."""
    settings = make_settings(tmp_path, make_model_dir(tmp_path))
    app = create_app(settings)
    stopping = app.state.harmony.alignment._stopping
    reached = threading.Event()
    real = alignment_module._slot_losses
    calls = 0

    def wait_for_shutdown(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 3:
            reached.set()
            stopping.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(alignment_module, "_slot_losses", wait_for_shutdown)
    with TestClient(app) as client:
        device = enrol(client)
        store_uploads(client, device, uploads=2)
        round_id = client.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"]
        assert reached.wait(30)
    monkeypatch.undo()
    with TestClient(create_app(settings)) as client:
        record = client.get(f"{ROUNDS}/{round_id}", headers=ADMIN).json()
        assert record["status"] == "interrupted" and record["error"] == "the server stopped during this round"
        assert (
            record["new_version"] is None
            and client.get("/v1/registry/versions", headers=ADMIN).json()["default"] == "v1"
        )
        assert client.app.state.harmony.store.upload_stats()["uploads"] == 2


def test_hot_swap_inference_answers_during_the_round_and_switches_after(server, monkeypatch):
    client, device, _ = server
    reached, release = block_round_at_step(monkeypatch, step=3, then_fail=False)
    round_id = client.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"]
    try:
        assert reached.wait(30)
        during = [infer_version(client, device)[0] for _ in range(5)]
        assert client.get(f"{ROUNDS}/{round_id}", headers=ADMIN).json()["status"] == "running"
    finally:
        release.set()
    assert during == ["v1"] * 5
    assert wait_for_round(client, round_id)["status"] == "published"
    assert infer_version(client, device)[0] == f"v1-r{round_id}"
    # the old version stays addressable by name after the swap
    old = client.post(
        "/v2/models/harmony-backend/versions/v1/infer",
        json=json_infer_body(class_features(np.array([4]), 99)),
        headers=bearer(device["token"]),
    )
    assert old.json()["model_version"] == "v1"


@pytest.mark.parametrize("server", STORE_BACKENDS, indirect=True)
def test_registry_set_default_and_rollback(server):
    client, device, settings = server
    assert (
        wait_for_round(client, client.post(ROUNDS, json=FAST, headers=ADMIN).json()["id"])["status"]
        == "published"
    )
    assert client.post("/v1/registry/rollback", headers=ADMIN).json()["default"] == "v1"
    assert infer_version(client, device)[0] == "v1"
    conflict = client.post("/v1/registry/rollback", headers=ADMIN)
    assert conflict.status_code == 409 and "no parent" in error_message(conflict)
    assert (
        client.put("/v1/registry/default", json={"version": "v1-r1"}, headers=ADMIN).json()["default"]
        == "v1-r1"
    )
    assert infer_version(client, device)[0] == "v1-r1"
    missing = client.put("/v1/registry/default", json={"version": "v404"}, headers=ADMIN)
    assert missing.status_code == 404 and "no back-end version 'v404'" in error_message(missing)
    assert client.get("/v1/registry/versions", headers=bearer(device["token"])).status_code == 403
    # the default survives a restart; re-importing the same model dir changes nothing
    with TestClient(create_app(settings)) as restarted:
        assert restarted.get("/v1/registry/versions", headers=ADMIN).json()["default"] == "v1-r1"
        assert len(restarted.get("/v1/registry/versions", headers=ADMIN).json()["versions"]) == 2
        assert restarted.app.state.harmony.registry.loaded("v1") is None  # not the default: not in memory
        old = restarted.post(
            "/v2/models/harmony-backend/versions/v1/infer",
            json=json_infer_body(class_features(np.array([4]), 99)),
            headers=bearer(device["token"]),
        )
        assert old.status_code == 200 and old.json()["model_version"] == "v1"  # loaded from its artifact


def test_a_new_export_becomes_the_default(tmp_path):
    settings = make_settings(tmp_path, make_model_dir(tmp_path, seed=0))
    with TestClient(create_app(settings)):
        pass
    make_model_dir(tmp_path, seed=1, model_version="v2")  # the export step writes a new back-end
    with TestClient(create_app(settings)) as client:
        registry = client.get("/v1/registry/versions", headers=ADMIN).json()
        assert registry["default"] == "v2" and [v["version"] for v in registry["versions"]] == ["v1", "v2"]
    make_model_dir(tmp_path, seed=2, model_version="v2")  # same name, other weights: kept apart by hash
    with TestClient(create_app(settings)) as client:
        default = client.get("/v1/registry/versions", headers=ADMIN).json()["default"]
        assert default.startswith("v2-") and len(default) == len("v2-") + 8


def upload(device: str, tokens: list[bytes]) -> FeatureUpload:
    n = len(tokens)
    return FeatureUpload(
        device, -1, LABEL_EPOCH, torch.zeros(n, 64, 8, 8), tuple(tokens), (1,) * n, "cnn", "t", "v"
    )


def test_rows_get_their_tokens_slots_and_their_devices_softmax_mask():
    a, b, c = b"A" * 8, b"B" * 8, b"C" * 8
    table = SlotTable(LABEL_EPOCH, 3, [b])  # b had slot 0 before the round
    rows = SlotRows.build([upload("d1", [a, b, a]), upload("d2", [c, c]), upload("d1", [b])], table, 3)
    assert rows.slots.tolist() == [1, 0, 1, 2, 2, 0] and table.tokens == [b, a, c]
    open_slots = [set(torch.nonzero(m == 0).flatten().tolist()) for m in rows.masks]
    assert open_slots == [{0, 1}] * 3 + [{2}] * 2 + [{0, 1}]
    full = SlotRows.build([upload("d3", [b"D" * 8, b])], table, 3)  # no free slot for D: dropped, counted
    assert full.rows == 1 and full.dropped_rows == 1


def test_slot_accuracy_counts_only_the_served_slots():
    scores = torch.tensor([[0.0, 5.0, 9.0], [3.0, 1.0, 0.0]])
    assert slot_accuracy(scores, torch.tensor([1, 0]), served_slots=2) == 1.0
    assert slot_accuracy(scores, torch.tensor([1, 0]), served_slots=3) == 0.5
