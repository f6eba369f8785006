"""Scratch screen, kept: where the hybrid's gap to the back-end at 50 % fallback comes from. Over
the saved HARMONY runs of one setting, each phone's test samples at OOD fraction 0.2 and 0.5 (as
the gate study draws them), the lowest-scoring half by the slot margin falling back: the share of
samples kept on the phone that are OOD or ID, what each kind costs against the back-end
answering them (server right minus exit right, over all samples), and the accuracies behind it.
Mean over phones and runs; fractions.

    python benchmarks/results/fashion-finish-screens/gap_decomposition.py \
        benchmarks/results/fashion/work/eval/fashion-family > gap_decomposition.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from harmony_mobile.bench.saved_runs import load_finished_run
from harmony_mobile.data.partition import ood_test_indices
from harmony_mobile.evaluation import client_answers
from harmony_mobile.federation.slot_gate import slot_gates


def phone_rows(run, answers, gate, client_id, p: float) -> dict | None:
    split = run.partition.clients[client_id]
    try:
        index, is_ood = ood_test_indices(split, run.labels.numpy(), run.partition.ood_pool, p, run.seed)
    except ValueError:  # the phone holds every class
        return None
    truth = answers.client.exit_labels(run.labels[index])
    answer = answers.split(index)
    exit_right = (answer.exit_prediction == truth).numpy().astype(int)
    server_right = (answer.server_prediction == truth).numpy().astype(int)
    score = gate.score(answer.features).numpy()
    kept = np.zeros(len(score), dtype=bool)
    kept[np.argsort(score, kind="stable")[round(0.5 * len(score)) :]] = True
    ood_kept, id_kept = kept & is_ood, kept & ~is_ood
    return {
        "p": p,
        "OOD kept (share of samples)": ood_kept.mean(),
        "ID kept (share of samples)": id_kept.mean(),
        "cost of OOD kept": ((server_right - exit_right) * ood_kept).mean(),
        "cost of ID kept": ((server_right - exit_right) * id_kept).mean(),
        "exit right on ID kept": exit_right[id_kept].mean(),
        "server right on ID kept": server_right[id_kept].mean(),
        "server right on OOD kept": server_right[ood_kept].mean() if ood_kept.any() else np.nan,
    }


def main(setting_dir: Path) -> None:
    torch.set_num_threads(1)
    rows, runs = [], []
    for path in sorted(setting_dir.glob("harmony/seed-*")):
        if not (path / "final_metrics.json").is_file():
            continue
        run = load_finished_run(path)
        runs.append(path.name)
        answers = client_answers(run.clients, run.served, run.images)
        gates = slot_gates(run.served.backend, run.served.slot_tokens, run.replay, run.clients)
        for (client_id, phone), gate in zip(answers.items(), gates, strict=True):
            rows += [r for p in (0.2, 0.5) if (r := phone_rows(run, phone, gate, client_id, p))]
    table = pd.DataFrame(rows).groupby("p").mean().round(4).T
    print(f"# The hybrid's gap at 50 % fallback, {setting_dir.name} ({', '.join(runs)})\n")
    print(table.to_markdown())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
