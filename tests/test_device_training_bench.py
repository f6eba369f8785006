"""benchmarks/device_training.py: its timing turns run every trainer on the same rows, and its report
calls the 3x target met or missed from the measured ratio."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks/device_training.py"


def load_script():
    spec = importlib.util.spec_from_file_location(SCRIPT.stem, SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Recorder:
    def __init__(self):
        self.rows = []

    def step(self, inputs, labels):
        self.rows.append(labels.clone())
        return 0.0


def test_timed_turns_feed_every_trainer_the_same_rows():
    bench = load_script()
    trainers = {"pte": Recorder(), "eager": Recorder()}
    labels = torch.arange(50)
    indices = torch.randint(0, 50, (10, 4), generator=torch.Generator().manual_seed(0))
    rates = bench.timed_turns(trainers, torch.zeros(50, 3), labels, indices, turns=5)
    assert set(rates) == {"pte", "eager"} and all(r > 0 for r in rates.values())
    assert len(trainers["pte"].rows) == 10
    assert all(torch.equal(a, b) for a, b in zip(trainers["pte"].rows, trainers["eager"].rows, strict=True))


def test_report_says_met_or_missed_from_the_measured_ratio():
    bench = load_script()
    speed = {"scope": "exit_classifier", "steps": 10, "trained_parameters": 1, "pte_steps_per_s": 1.0}
    accuracy = dict.fromkeys(
        [
            "accuracy_before",
            "accuracy_after_pte",
            "accuracy_after_eager",
            "final_loss_pte",
            "final_loss_eager",
        ],
        0.5,
    )
    accuracy.update(
        steps=10, train_samples=5, test_samples=5, loss_max_abs_difference=0, logits_max_abs_difference=0
    )
    tiers = [
        {
            "tier": name,
            "family": "cnn",
            "speed": [{**speed, "eager_steps_per_s": eager, "pte_time_over_eager": eager}],
            "accuracy": accuracy,
        }
        for name, eager in (("fast", 2.9), ("slow", 3.1))
    ]
    report = {
        "run": "test",
        "versions": {"torch": "t", "executorch": "e"},
        "threads": 1,
        "batch": 32,
        "learning_rate": 0.01,
        "target_pte_time_over_eager": 3.0,
        "tiers": tiers,
    }
    rows = [line for line in bench.markdown(report).splitlines() if line.startswith(("| fast", "| slow"))]
    assert rows[0].endswith("| 2.90x | met |") and rows[1].endswith("| 3.10x | missed |")
