"""A small `harmony demo` end to end: the same code path as `make demo` (training, export with the
ExecuTorch toolchain, a real `harmony serve` subprocess, phones on the device runtime running .pte,
drift, sealed uploads, an alignment round) on the digits data, two tiers and a tiny budget."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch
import yaml
from rich.console import Console

from harmony_mobile.algorithms.base import calibrate_threshold
from harmony_mobile.demo import PHASES, DemoConfig, recovery_rows, run_demo, to_pixels
from harmony_mobile.demo.phones import PhoneData
from harmony_mobile.demo.run import outage_sample
from harmony_mobile.device import FrontEndProgram, normalize
from harmony_mobile.device.personalization import PersonalizedFrontEnd
from harmony_mobile.protocol.slot_gate import slot_margin
from harmony_mobile.protocol.wire import decode_tensor
from harmony_mobile.run_dir import RunDir

# Each tier exports the one .pte variant its phones run (DemoConfig.quantization): the fp32 variant
# would add a third of the export and nothing this test reads (the export tests cover it).
TIERS = {
    "tiers": [
        {"name": "entry-android", "family": "cnn", "split_depth": 1, "quantization": ["int8"]},
        {"name": "mid-android", "family": "mobilenet", "split_depth": 2, "quantization": ["int8"]},
    ]
}
CONFIRMED = 24


def small_demo(root, **overrides) -> DemoConfig:
    """The demo on digits, two small tiers, two rounds: what the demo tests run."""
    tiers_file = root / "tiers.yaml"
    tiers_file.write_text(yaml.safe_dump(TIERS))
    settings = dict(
        out=root / "out",
        dataset="digits",
        tiers_file=str(tiers_file),
        clients_per_tier=2,
        rounds=2,
        max_test=40,
        confirmed=CONFIRMED,
        drift_steps=40,
        latency_runs=2,
        alignment={"steps": 20},  # otherwise the server's defaults
    )
    return DemoConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    config = small_demo(tmp_path_factory.mktemp("demo"))
    console = Console(record=True, width=160)
    report = run_demo(config, console)
    return config, report, console.export_text()


def test_every_phone_used_the_server_and_uploaded(demo):
    config, report, _ = demo
    assert set(report["results"]) == {"entry-android", "mid-android"}
    for tier, phases in report["results"].items():
        assert list(phases) == list(PHASES)
        for phase, r in phases.items():
            assert r["samples"] > r["ood_samples"] > 0, (tier, phase)
            assert r["fallback_rate"] > 0 and r["server_failures"] == 0, (tier, phase, r)
            assert r["infer_bytes"] > 0 and r["infer_bytes"] % (8 + 16 + 4 * 64 * 8 * 8) == 0
            assert abs(r["exit_rate"] + r["fallback_rate"] - 1) < 1e-9
            assert 0 < r["median_latency_ms"] < 1000
        for phase in ("deployed", "drifted"):
            assert report["uploads"][tier][phase]["rows"] == CONFIRMED
            assert report["uploads"][tier][phase]["upload_bytes"] > CONFIRMED * 64 * 8 * 8 * 4


def test_outage_answered_locally_and_lost_no_upload(demo):
    _, report, _ = demo
    for tier, outage in report["outage"].items():
        assert outage["answered"] == outage["local_exit"] + outage["local_after_server_failure"], tier
        assert outage["local_after_server_failure"] > 0, outage
        assert outage["queued_uploads"] >= 1 and outage["flush_error"], outage
        assert outage["delivered_after_restart"] == outage["queued_uploads"], outage
        assert report["uploads"][tier]["drifted"]["duplicates"] == 0


def test_drift_trained_through_the_executorch_training_program(demo):
    config, report, _ = demo
    for tier, drift in report["drift"].items():
        assert drift["trained_through"] == f"tiers/{tier}/personalize_train.pte", tier
        assert drift["steps"] == config.drift_steps and drift["steps_per_second_pte"] > 0
        assert drift["loss_max_abs_vs_eager"] < 1e-3, (tier, drift)  # same steps as eager PyTorch
        assert drift["pte_vs_eager_speed"] == pytest.approx(
            drift["steps_per_second_pte"] / drift["steps_per_second_eager"]
        )
    assert "ExecuTorch training program" in (config.out / "demo-report.md").read_text()


def personalized_front_end(out, entry) -> PersonalizedFrontEnd:
    """The phone's front-end after personalization, rebuilt from the export and its saved parameters."""
    programs = entry["personalization"]
    saved = np.load(out / "phones" / entry["name"] / "personalized_parameters.npz")
    return PersonalizedFrontEnd(
        FrontEndProgram((out / "export" / programs["frozen_program"]["path"]).read_bytes()),
        (out / "export" / programs["head_program"]["path"]).read_bytes(),
        [torch.from_numpy(saved[name]) for name in programs["parameter_names"]],
    )


def test_drifted_phone_recalibrated_its_threshold_on_its_val_data(demo):
    """The phones exit by the slot margin (HARMONY's gate: the export ships the server's prototypes,
    each phone scores with the classes it holds) and, after drift, answer with tau recalibrated on
    the margin of its own val split through its trained head (docs/ALGORITHM.md, "The exit gate"),
    not with the manifest's tau of the front-end it no longer runs."""
    config, report, _ = demo
    run = RunDir(config.out / "run")
    dataset, info = run.dataset(), run.info
    clients = {c.client_id: c for c in run.clients()}
    manifest = json.loads((config.out / "export" / "manifest.json").read_text())
    prototypes = torch.from_numpy(
        decode_tensor((config.out / "export" / manifest["slot_prototypes"]["path"]).read_bytes())
    )
    slot_classes = run.slot_to_class().tolist()  # the experimenter's view: class of each slot
    for entry in manifest["tiers"]:
        tier, drift, phases = entry["name"], report["drift"][entry["name"]], report["results"][entry["name"]]
        assert entry["threshold_source"] == "calibrated"
        assert entry["exit_rule"] == "slot_margin" and -2 <= entry["threshold"] <= 2
        assert phases["deployed"]["threshold"] == drift["threshold_deployed"] == entry["threshold"]
        assert phases["deployed"]["fallback_rate"] > 0, phases["deployed"]
        client = clients[entry["client_id"]]
        own = torch.tensor([c in client.classes for c in slot_classes])
        val = list(client.val_idx)
        pixels = to_pixels(dataset.images[val], info.mean, info.std)
        logits, features = personalized_front_end(config.out, entry).run(
            normalize(pixels, entry["normalization"])
        )
        margins = slot_margin(features.double(), prototypes.double(), own).float()
        correct = logits.argmax(1) == run.exit_labels(dataset.labels[val])  # exit outputs: token order
        expected = calibrate_threshold(margins, correct, 0.98)  # training's default target
        assert drift["calibration_target"] == 0.98 and drift["val_samples"] == len(val)
        assert expected != entry["threshold"], tier  # drift moves tau here, so the check below has teeth
        assert drift["threshold_drifted"] == pytest.approx(expected, abs=1e-6)
        assert np.isfinite(drift["threshold_deployed_pte"])
        for phase in ("drifted", "aligned"):  # what the phone actually answered with
            assert phases[phase]["threshold"] == pytest.approx(expected, abs=1e-6), (tier, phase)


def test_alignment_round_trained_on_every_upload_and_finished(demo):
    _, report, _ = demo
    alignment = report["alignment"]
    assert alignment["status"] in ("published", "rejected"), alignment
    assert alignment["metrics"]["rows"] == 2 * 2 * CONFIRMED  # two phones, two phases, each stored once
    assert alignment["metrics"]["replay_shipped_rows"] > 0  # training wrote a replay set into backend.pt
    assert alignment["metrics"]["distillation"] == "on replay rows"
    versions = [v["version"] for v in report["registry"]["versions"]]
    if alignment["status"] == "published":
        assert (
            alignment["new_version"] in versions and report["registry"]["default"] == alignment["new_version"]
        )
        served = {r["aligned"]["server_fallback_accuracy"] for r in report["results"].values()}
        assert served  # the aligned phase ran against the new default version
    else:
        assert versions == [report["export"]["model_version"]]


def test_report_written_and_server_stopped(demo):
    config, report, printed = demo
    markdown = (config.out / "demo-report.md").read_text()
    for tier in report["results"]:
        assert f"| {tier} | deployed |" in markdown and f"| {tier} | aligned |" in markdown
    assert (config.out / "plots" / "accuracy.png").stat().st_size > 1000
    assert (
        json.loads((config.out / "demo-report.json").read_text())["alignment"]["id"]
        == report["alignment"]["id"]
    )
    assert "drift and recovery" in printed
    assert report["server"]["exit_status"] in (0, -15)
    with pytest.raises(httpx.TransportError):
        httpx.get(report["server"]["url"] + "/v2/health/live", timeout=2)
    assert "Traceback" not in (config.out / "server.log").read_text()


def test_drift_loss_and_recovery_are_measured_on_the_server_accuracy_not_on_the_exit_threshold():
    def phase(server, with_ood):
        return {
            "server_accuracy": server,
            "server_accuracy_ood": server,
            "accuracy_with_ood": with_ood,
            "exit_rate": 0.5,
        }

    # with-OOD accuracy rises after drift (a lower tau), the server's accuracy falls 20 points and
    # alignment wins back 15 of them
    report = {
        "results": {
            "t": {"deployed": phase(0.8, 0.6), "drifted": phase(0.6, 0.7), "aligned": phase(0.75, 0.7)}
        },
        "drift": {"t": {"threshold_deployed": 0.9, "threshold_drifted": 0.8}},
    }
    (row,) = recovery_rows(report)
    assert row[1:4] == ["80.0% -> 60.0% -> 75.0%", "+20.0 pts", "75.0%"]


def test_the_outage_sample_holds_images_the_phone_would_send_to_the_server():
    """Even when the threshold lets almost everything exit, half the outage images (as far as there
    are) are ones the phone is unsure of, so the failed-fallback path is exercised."""
    pixels = np.arange(40, dtype=np.uint8).reshape(40, 1, 1, 1)
    unsure = {3, 17, 31}  # 3 of 40 images: a spread of 20 would likely miss most of them

    class FakePhone:
        def would_exit(self, image) -> bool:
            return int(image.flat[0]) not in unsure

    data = PhoneData("t", None, pixels, np.zeros(40), np.zeros(40, bool), {}, pixels[:0], np.zeros(0))
    sample = outage_sample(data, FakePhone(), 20)
    values = {int(v) for v in sample.flatten()}
    assert len(sample) == 20 and unsure <= values
