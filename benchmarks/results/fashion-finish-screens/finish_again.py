"""Scratch screen, kept: a finished `fashion` bench run's end once more from its last-round
checkpoint (personalization, replay set, slot gate, calibration, evaluation) with one setting of the
final personalization changed; appends one JSON row to OUT/finish_rows.jsonl and prints the paired
differences against the run's own bench.json with `--compare`.

    python finish_again.py RUN_DIR VARIANT OUT        # VARIANT: base p0 p2 g0 g3 server xh1 xh3
    python finish_again.py --compare OUT/finish_rows.jsonl

`base` reproduces the run's final metrics exactly (checked on fashion-family seed 0). `server` lets
the back-end keep learning from each phone's personalization uploads (the other variants freeze it).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from harmony_mobile import training
from harmony_mobile.algorithms import base
from harmony_mobile.algorithms.registry import build_algorithm
from harmony_mobile.bench.gates import gate_studies
from harmony_mobile.bench.hooks import unseen_class_accuracy, validation_metrics
from harmony_mobile.federation.rounds import personalization_round, seed_turn

OVERRIDES = {"base": {}, "p0": {"personalize_epochs": 0}, "p2": {"personalize_epochs": 2}}
OVERRIDES |= {"g0": {"gamma": 0.0}, "g3": {"gamma": 3.0}, "server": {}}
OVERRIDES |= {f"xh{k}": {"exit_head_epochs": k} for k in (1, 3, 6, 10)}  # head-only epochs
KEYS = ("val_with_ood", "test_with_ood", "val50", "test50", "testserver", "unseen")


def copy_until_last_round(src: Path, dst: Path) -> None:
    """run.json, the last-round checkpoint and the lineage (secret, epoch); no client or back-end file."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src / "checkpoints", dst / "checkpoints")
    shutil.copy(src / "run.json", dst / "run.json")
    (dst / "clients").mkdir()
    for path in (src / "clients").iterdir():
        if not path.name.startswith("client-"):
            shutil.copy(path, dst / "clients" / path.name)
    kept = {"run.json", "final_metrics.json", "backend.pt", "metrics.jsonl", "bench.json"}
    for path in src.iterdir():
        if path.is_file() and path.name not in kept:
            shutil.copy(path, dst / path.name)


class Capture(training.TrainObserver):
    def __init__(self, seed: int):
        self.seed, self.found = seed, {}

    def after_evaluate(self, clients, served, images, labels, partition, results, exit_rule, answers, replay):
        self.found["val"] = validation_metrics(answers, labels, partition, self.seed, exit_rule)
        self.found["gates"] = gate_studies(answers, served, labels, partition, self.seed, exit_rule, replay)
        self.found["unseen"] = unseen_class_accuracy(answers, labels, partition, self.seed)


def curve_row(gates: dict) -> dict:
    row = {}
    for on in ("val", "test"):
        parts = [value for key, value in gates[on].items() if key.startswith("p=")]
        row[on + "50"] = float(np.mean([p["curve"]["slot_margin"][10] for p in parts]))  # 50 % fallback
        row[on + "server"] = float(np.mean([p["server_only"] for p in parts]))
    return row


def settings_before_the_step(src: Path) -> dict:
    """A run recorded before HARMONY's exit-head epochs existed trained none: its record's resolved
    settings lack the field, whose default is now 3."""
    recorded = json.loads((src / "bench.json").read_text()).get("algorithm_settings", {})
    return {} if "exit_head_epochs" in recorded else {"exit_head_epochs": 0}


def start_again(src: Path, variant: str, out: Path):
    """The saved run's copy up to its last round, loaded: (config, run, history)."""
    config = training.TrainConfig(**json.loads((src / "run.json").read_text())["train_config"])
    dst = out / f"{src.parent.parent.name}-{src.name}-{variant}"
    copy_until_last_round(src, dst)
    run = training.start_run(config, dst)
    return config, run, training.train_rounds(run)  # every round is done: loads the checkpoint only


def finish_row(src: Path, variant: str, run, history, started: float) -> dict:
    """The run's end (replay set, gate, calibration, evaluation) and its row."""
    capture = Capture(run.config.seed)
    results = training.finish_run(run, history, capture)
    row = {"variant": variant, "run": str(src), "test_with_ood": results["summary"]["accuracy_with_ood"]}
    row |= {"val_with_ood": capture.found["val"]["accuracy_with_ood"], **curve_row(capture.found["gates"])}
    return row | {"unseen": capture.found["unseen"].get("family_mean"), "seconds": time.time() - started}


def finish_again(src: Path, variant: str, out: Path) -> dict:
    started = time.time()
    config, run, history = start_again(src, variant, out)
    settings = settings_before_the_step(src) | dict(config.algorithm_config) | OVERRIDES[variant]
    run.federation.algorithm = build_algorithm(config.algorithm, settings)
    if variant == "server":
        frozen = base.split_step
        base.split_step = lambda *args, **kwargs: frozen(*args, **(kwargs | {"update_server": True}))
    for index, client in enumerate(run.clients):
        run.federation.broadcast(client)
        generator = seed_turn(config.seed, personalization_round(config.rounds), index)
        run.federation.algorithm.personalize(client, run.federation.server, generator)
    return finish_row(src, variant, run, history, started)


def bench_row(run: Path) -> dict:
    record = json.loads((Path(run) / "bench.json").read_text())
    row = {"val_with_ood": record["validation"]["accuracy_with_ood"]}
    row |= {"test_with_ood": record["summary"]["accuracy_with_ood"], **curve_row(record["gates"])}
    return row | {"unseen": record["unseen"].get("family_mean")}


def compare(rows_file: Path) -> None:
    """Variant minus the run's own record, paired over its runs per setting: mean ± 95 % t half-width."""
    by_variant = defaultdict(list)
    for line in rows_file.read_text().splitlines():
        row = json.loads(line)
        by_variant[row["variant"]].append(row)
    for variant, rows in by_variant.items():
        for setting in ("fashion-family", "fashion-dirichlet"):
            picked = [r for r in rows if f"/{setting}" in r["run"]]
            cells = []
            for key in KEYS:
                pairs = [(r[key], bench_row(r["run"])[key]) for r in picked]
                diff = 100 * np.array([a - b for a, b in pairs if a is not None and b is not None])
                if len(diff) > 1:
                    half = 2.776 * diff.std(ddof=1) / np.sqrt(len(diff))  # t(0.975, 4): 5 runs
                    cells.append(f"{key} {diff.mean():+.2f} ± {half:.2f}")
            print(f"{variant} {setting} n={len(picked)}: " + " | ".join(cells))


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "--compare":
        compare(Path(sys.argv[2]))
    else:
        out = Path(sys.argv[3])
        row = finish_again(Path(sys.argv[1]), sys.argv[2], out)
        with open(out / "finish_rows.jsonl", "a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(json.dumps(row))
