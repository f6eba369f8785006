"""The upload protections the served manifest's `run` turns on are enforced on uploads of its lineage
(docs/PROTOCOL.md 4.4, 4.5): a missing or different label-DP epsilon, clip norm or noise multiplier
is 422 naming the field, and nothing is stored."""

from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient
from harmony_mobile.server import create_app

from tests.helpers.fallback_server import (
    LABEL_EPOCH,
    TIER_DEPTHS,
    TIER_FAMILIES,
    bearer,
    enrol,
    error_message,
    make_model_dir,
    make_settings,
    sealed_upload,
)

torch.set_num_threads(1)
TIER = "mid-android"
PROTECTED_RUN = {"label_dp_epsilon": 1.0, "feature_clip": 2.0, "noise_multiplier": 0.5}
AS_APPLIED = {"label_dp_epsilon": 1.0, "clip_norm": 2.0, "noise_multiplier": 0.5}


def serve_with_run(root, run: dict) -> TestClient:
    """A back-end of version v1 and a manifest of that version and label epoch with this `run`."""
    model_dir = make_model_dir(root)
    tier = {"name": TIER, "family": TIER_FAMILIES[TIER], "split_depth": TIER_DEPTHS[TIER]}
    manifest = {"model_version": "v1", "label_epoch": LABEL_EPOCH, "run": run, "tiers": [tier]}
    (model_dir / "manifest.json").write_text(json.dumps(manifest) + "\n")
    return TestClient(create_app(make_settings(root, model_dir)))


@pytest.fixture(scope="module")
def protected(tmp_path_factory):
    with serve_with_run(tmp_path_factory.mktemp("protected"), {"seed": 0, **PROTECTED_RUN}) as client:
        yield client, enrol(client, tier=TIER)


def stored_count(client) -> int:
    return client.app.state.harmony.store.upload_stats()["uploads"]


def upload(client, device, **metadata):
    body = sealed_upload(device, LABEL_EPOCH, [1, 2], **metadata)
    return client.post("/v1/uploads", json=body, headers=bearer(device["token"]))


def test_an_upload_with_the_runs_protections_is_stored(protected):
    client, device = protected
    response = upload(client, device, **AS_APPLIED)
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"label_dp_epsilon": None},
            "label_dp_epsilon is missing; uploads of label epoch 'e-server-tests' apply the served"
            " manifest's run.label_dp_epsilon = 1.0",
        ),
        ({"label_dp_epsilon": 4.0}, "label_dp_epsilon is 4.0; uploads of label epoch"),
        (
            {"clip_norm": 3.0},
            "clip_norm is 3.0; uploads of label epoch 'e-server-tests' apply the served manifest's"
            " run.feature_clip = 2.0",
        ),
        ({"clip_norm": None, "noise_multiplier": None}, "clip_norm is missing"),
        ({"noise_multiplier": 0.25}, "noise_multiplier is 0.25; uploads of label epoch"),
        ({"noise_multiplier": None}, "noise_multiplier is missing"),
    ],
)
def test_a_protection_the_run_turns_on_must_be_declared_with_its_value(protected, changes, message):
    client, device = protected
    count = stored_count(client)
    response = upload(client, device, **{**AS_APPLIED, **changes})
    assert response.status_code == 422, response.text
    assert error_message(response).startswith(message)
    assert stored_count(client) == count


def test_a_protection_the_run_leaves_off_is_not_required_but_kept_as_declared(tmp_path):
    with serve_with_run(tmp_path, {"seed": 0, "label_dp_epsilon": None}) as client:
        device = enrol(client, tier=TIER)
        assert upload(client, device).status_code == 201
        response = upload(client, device, clip_norm=5.0)
        assert response.status_code == 201, response.text
