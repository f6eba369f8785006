"""Evaluation-only study of the exit gate over finished runs: each run's accuracy-vs-fallback curve
for every gate score (harmony_mobile/bench/gates.py), on validation and on test; beside it the
run's validation accuracy with and without OOD at its calibrated thresholds and the back-end's
accuracy on each family's unseen classes (what the benchmark records for its runs).

    python benchmarks/gate_study.py RUN_DIR [RUN_DIR ...] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from harmony_mobile.bench.gates import FALLBACK_GRID, gate_studies
from harmony_mobile.bench.hooks import unseen_class_accuracy, validation_metrics
from harmony_mobile.bench.saved_runs import load_finished_run
from harmony_mobile.evaluation import client_answers


def study_run(path: Path) -> dict:
    run = load_finished_run(path)
    answers = client_answers(run.clients, run.served, run.images)
    args = (answers, run.labels, run.partition, run.seed)
    validation = validation_metrics(*args, run.exit_rule)
    unseen = unseen_class_accuracy(*args)
    return {
        "val_accuracy_with_ood": validation["accuracy_with_ood"],
        "val_accuracy_without_ood": validation["accuracy_without_ood"],
        "unseen_family": unseen["family_mean"],
        **gate_studies(answers, run.served, run.labels, run.partition, run.seed, run.exit_rule),
    }


def print_table(name: str, study: dict) -> None:
    shown = [i for i, r in enumerate(FALLBACK_GRID) if r in (0.0, 0.1, 0.2, 0.3, 0.5, 1.0)]
    print(
        f"{name}: validation accuracy with OOD {study['val_accuracy_with_ood']:.3f}, without "
        f"{study['val_accuracy_without_ood']:.3f}; back-end on unseen classes {study['unseen_family']:.3f}"
    )
    for on in ("val", "test"):
        for p, row in study[on].items():
            if not p.startswith("p="):
                continue
            print(f"{name} {on} {p}: oracle {row['oracle']:.3f} server-only {row['server_only']:.3f}")
            for gate, curve in row["curve"].items():
                points = " ".join(f"{FALLBACK_GRID[i]:.1f}:{curve[i]:.3f}" for i in shown)
                print(f"  {gate:12s} auroc {row['auroc'][gate]:.3f}  {points}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    studies = {}
    for path in args.runs:
        studies[str(path)] = study_run(path)
        print_table(str(path), studies[str(path)])
    if args.out:
        args.out.write_text(json.dumps(studies, indent=1))


if __name__ == "__main__":
    main()
