"""`harmony demo` with phones that exit by the slot margin (docs/PROTOCOL.md 3.5): the export ships
the prototypes, every phone gates by them with the classes it holds, and after on-device drift it
recalibrates tau on the margin. A small run (the e2e demo test covers the rest of the product)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from rich.console import Console

from harmony_mobile.algorithms.base import calibrate_threshold
from harmony_mobile.demo import run_demo
from harmony_mobile.demo.phones import to_pixels
from harmony_mobile.device import normalize
from harmony_mobile.protocol.slot_gate import slot_margin
from harmony_mobile.protocol.wire import decode_tensor
from harmony_mobile.run_dir import RunDir
from tests.test_demo_e2e import personalized_front_end, small_demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo-gate")
    config = small_demo(
        root, algorithm="harmony-slot-gate", max_test=30, confirmed=8, drift_steps=10, alignment={"steps": 5}
    )
    return config, run_demo(config, Console(record=True, width=160))


def test_phones_gate_by_the_shipped_prototypes_and_recalibrate_on_the_margin(demo):
    config, report = demo
    manifest = json.loads((config.out / "export" / "manifest.json").read_text())
    prototypes = torch.from_numpy(
        decode_tensor((config.out / "export" / manifest["slot_prototypes"]["path"]).read_bytes())
    )
    run = RunDir(config.out / "run")
    dataset, info = run.dataset(), run.info
    clients = {c.client_id: c for c in run.clients()}
    slot_classes = run.slot_to_class().tolist()  # the experimenter's view: class of each slot
    for entry in manifest["tiers"]:
        tier, drift = entry["name"], report["drift"][entry["name"]]
        assert entry["exit_rule"] == "slot_margin" and -2 <= entry["threshold"] <= 2
        phases = report["results"][tier]
        assert phases["deployed"]["threshold"] == entry["threshold"]
        assert phases["deployed"]["fallback_rate"] > 0, phases["deployed"]
        client = clients[entry["client_id"]]
        own = torch.tensor([c in client.classes for c in slot_classes])
        pixels = to_pixels(dataset.images[list(client.val_idx)], info.mean, info.std)
        logits, features = personalized_front_end(config.out, entry).run(
            normalize(pixels, entry["normalization"])
        )
        margins = slot_margin(features.double(), prototypes.double(), own).float()
        correct = logits.argmax(dim=1) == run.exit_labels(dataset.labels[list(client.val_idx)])
        assert drift["threshold_drifted"] == calibrate_threshold(
            margins, correct, drift["calibration_target"]
        )
        assert phases["drifted"]["threshold"] == drift["threshold_drifted"]
        assert np.isfinite(drift["threshold_deployed_pte"])
