"""Validation-only probe: one method of the `standard` profile, its config overridden, trained on
settings and seeds of your choice (use seeds no profile evaluates on, e.g. 100-102); prints
one JSON line per run with its validation accuracies and, as diagnostics, the test-split halves of
the hybrid at p=0 (exit alone, back-end alone). A probe to decide what a profile should run, not a
benchmark.

    .venv/bin/python benchmarks/validation_probe.py pe8 harmony \\
        mnist5k-dirichlet-0.1:100,mnist5k-dirichlet-0.1:101 '{"personalize_epochs": 8}'
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from harmony_mobile.bench.profile import load_profile
from harmony_mobile.bench.runner import RunSpec, run_one


def main(label: str, method: str, runs: str, overrides: str = "{}") -> None:
    torch.set_num_threads(1)
    profile = load_profile("standard")
    settings = {s.name: s for s in profile.settings}
    config = {**profile.method_config(method), **json.loads(overrides)}
    with tempfile.TemporaryDirectory() as work_dir:
        for run in runs.split(","):
            setting, seed = run.rsplit(":", 1)
            spec = RunSpec(
                "tune", settings[setting], method, int(seed), profile.method_budget(method).rounds, config
            )
            record = run_one(spec, profile.train, Path(work_dir))
            id_only = record["mean"]["p=0"]
            line = {
                "variant": label,
                "method": method,
                "setting": setting,
                "seed": int(seed),
                "overrides": json.loads(overrides),
                "val_with_ood": record["validation"]["accuracy_with_ood"],
                "val_p0": record["validation"]["accuracy_without_ood"],
                "exit_only_p0_test": id_only.get("exit_only_accuracy"),
                "server_acc_p0_test": id_only.get("server_accuracy"),
                "exit_rate_p0_test": id_only.get("exit_rate"),
                "wall": record["wall_seconds"],
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    main(*sys.argv[1:])
