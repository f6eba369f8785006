"""On-device personalization through ExecuTorch's training runtime (export/personalization.py,
harmony_mobile/device/personalization.py) on a real export of a tiny run: the programs are in the
signed manifest, a few SGD steps through the training .pte lower the loss exactly as the same steps
in eager PyTorch do, and the phone answers with the trained parameters and a recalibrated tau."""

from __future__ import annotations

import copy
import shutil

import httpx
import numpy as np
import pytest
import torch
from harmony_mobile.export.keys import encode_public_key, load_or_create_signing_key
from harmony_mobile.export.manifest import verify_manifest
from harmony_mobile.export.personalization import FrozenPart, TrainedPart
from harmony_mobile.export.pipeline import export_run

from harmony_mobile.algorithms.base import calibrate_threshold
from harmony_mobile.device import (
    DeviceCredentials,
    DeviceError,
    FederationKey,
    Phone,
    UploadQueue,
    load_manifest,
)
from harmony_mobile.device import personalization as device_personalization
from harmony_mobile.device.manifest import normalize
from harmony_mobile.device.personalization import (
    Personalizer,
    batch_indices,
    calibrate_exit_threshold,
    personalize_phone,
)
from harmony_mobile.run_dir import RunDir
from tests.export_fixtures import FIXTURE_SECRET, make_run_dir

TIER = "tiny"
STEPS = 12
LEARNING_RATE = 1.0  # the random-initialized front-end's exit features are small


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("personalization")
    run = make_run_dir(root / "run", clients_per_tier=1)
    key, _ = load_or_create_signing_key(root / "keys")
    export_run(
        run, root / "export", tiers=[TIER], private_key=key, latency_runs=2, test_samples=8, progress=False
    )
    manifest = load_manifest(root / "export", encode_public_key(key.public_key()))
    return RunDir(run), root / "export", manifest


def own_samples(run: RunDir) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(raw pixels, class ids, exit positions) of the tier's client's training split."""
    client = run.representative_client(TIER)
    data = run.dataset()
    index = np.asarray(client.train_idx)
    labels = torch.as_tensor(data.labels)[index]
    return data.images[index], labels, run.exit_labels(labels)


def test_the_signed_manifest_lists_the_training_programs(tmp_path, export):
    _, export_dir, manifest = export
    entry = manifest["tiers"][0]["personalization"]
    assert entry["labels"] == "exit_positions" and entry["optimizer"] == "sgd"
    assert entry["parameter_names"] == [
        "classifier.0.weight",
        "classifier.0.bias",
        "classifier.2.weight",
        "classifier.2.bias",
    ]
    listed = {f["path"] for f in manifest["files"]}
    for key in ("frozen_program", "training_program", "head_program"):
        assert entry[key]["path"] in listed
    verify_manifest(export_dir)  # the programs' digests are checked like every artifact's
    export_dir = shutil.copytree(export_dir, tmp_path / "export")
    (export_dir / entry["training_program"]["path"]).write_bytes(b"not the signed program")
    with pytest.raises(DeviceError, match="does not match the signed manifest"):
        Personalizer(export_dir, manifest, TIER)


def test_steps_through_the_pte_lower_the_loss_like_eager_pytorch(tmp_path, export):
    run, export_dir, manifest = export
    personalizer = Personalizer(export_dir, manifest, TIER, learning_rate=LEARNING_RATE)
    images, _, positions = own_samples(run)
    images, positions = images[:32], positions[:32]  # few samples: a dozen steps fit them visibly
    front_end = run.front_end(run.representative_client(TIER))
    hidden, features = personalizer.frozen.run(images)
    eager_hidden, eager_features = FrozenPart(copy.deepcopy(front_end)).eval()(images)
    assert torch.allclose(hidden, eager_hidden.detach(), atol=1e-4)
    assert torch.allclose(features, eager_features.detach(), atol=1e-4)

    result = personalizer.train(hidden, positions, STEPS, seed=3)

    eager = TrainedPart(front_end, "exit_classifier")
    sgd = torch.optim.SGD(eager.parameters(), lr=LEARNING_RATE)
    eager_losses = []
    for rows in torch.as_tensor(batch_indices(len(hidden), personalizer.training.batch, STEPS, 3)):
        loss, _ = eager(hidden[rows], positions[rows])
        sgd.zero_grad()
        loss.backward()
        sgd.step()
        eager_losses.append(loss.item())
    assert np.allclose(result.losses, eager_losses, atol=1e-4), (result.losses, eager_losses)
    with torch.no_grad():
        after = float(eager(hidden, positions)[0])
        before = float(TrainedPart(front_end, "exit_classifier")(hidden, positions)[0])
    assert after < before - 0.05, (before, after, result.losses)

    personalized = personalizer.front_end()
    logits, personalized_features = personalized.run(images[:5])
    with torch.no_grad():
        assert torch.allclose(logits, eager.classifier(hidden[:5]), atol=1e-4)
    assert torch.equal(personalized_features, features[:5])  # the server's features do not move


def test_threshold_rule_is_training_s(export):
    generator = torch.Generator().manual_seed(0)
    for target in (0.5, 0.9, 0.99, 1.0):
        confidence = torch.rand(200, generator=generator).round(decimals=2)  # with ties
        correct = torch.rand(200, generator=generator) < confidence
        assert calibrate_exit_threshold(confidence.numpy(), correct.numpy(), target) == calibrate_threshold(
            confidence, correct, target
        )


class RecordingTraining(device_personalization.TrainingProgram):
    """The real training program, recording the labels each step is fed."""

    fed: list[torch.Tensor] = []

    def step(self, hidden, exit_positions):
        RecordingTraining.fed.append(exit_positions.clone())
        return super().step(hidden, exit_positions)


def test_a_phone_trains_on_exit_positions_and_recalibrates_tau(tmp_path, export, monkeypatch):
    run, export_dir, manifest = export
    monkeypatch.setattr(device_personalization, "TrainingProgram", RecordingTraining)
    RecordingTraining.fed = []
    phone = Phone(
        manifest=manifest,
        tier=TIER,
        program=None,
        server_url="http://unused",
        credentials=DeviceCredentials("device-1", "token", b"\x00" * 32, {}),
        federation_key=FederationKey(FIXTURE_SECRET),
        queue=UploadQueue(tmp_path / "queue"),
        http=httpx.Client(),
    )
    images, class_ids, positions = own_samples(run)
    assert not torch.equal(positions, class_ids)  # the secret's order is not the class order
    pixels = (images * 80 + 80).clamp(0, 255).numpy()  # any pixels: the phone normalizes them
    result = personalize_phone(
        phone,
        Personalizer(export_dir, manifest, TIER),
        (pixels[:100], class_ids[:100].tolist()),
        (pixels[100:], class_ids[100:].tolist()),
        steps=4,
        seed=0,
        model_version="test+local-1",
        target=0.5,
    )
    expected = torch.as_tensor(batch_indices(100, 32, 4, 0))
    assert all(
        torch.equal(fed, positions[rows]) for fed, rows in zip(RecordingTraining.fed, expected, strict=True)
    )
    assert isinstance(phone.program, device_personalization.PersonalizedFrontEnd)
    assert phone.model_version == "test+local-1" and result.val_samples == len(pixels) - 100
    val = normalize(pixels[100:], phone.normalization)
    expected_tau = device_personalization.recalibrate(phone.program, val, positions[100:], 0.5)
    assert phone.threshold == expected_tau == result.threshold


@pytest.mark.parametrize("scope", ["exit_classifier", "exit_head", "exit_head+last_stage"])
def test_each_trainable_scope_computes_the_front_ends_exit_logits(scope):
    """The training graphs pool with reshape + mean (the training runtime has no
    avg_pool2d_backward): the same logits as the front-end's AvgPool2d, and only the scope's
    parameters are in the module (each reaches the loss)."""
    from harmony_mobile.export.personalization import trained_part_inputs

    from harmony_mobile.models import FamilyModel, InterfaceSpec

    torch.manual_seed(0)
    front_end = FamilyModel("mobilenet", 1, 28, 10, 1.0, InterfaceSpec(64, 8)).front_end(2).eval()
    images = torch.randn(4, 1, 28, 28)
    part = TrainedPart(front_end, scope)
    with torch.no_grad():
        expected, _ = front_end(images)
        logits = part.logits(trained_part_inputs(front_end, scope, images))
    assert torch.allclose(logits, expected, atol=1e-5)
    loss, _ = part(trained_part_inputs(front_end, scope, images), torch.arange(4))
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters())
    trained = {
        "exit_classifier": 4,
        "exit_head": 6,
        "exit_head+last_stage": 6 + len(list(front_end.stages[-1].parameters())),
    }
    assert len(list(part.parameters())) == trained[scope]
