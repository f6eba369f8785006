"""Evaluation-only screening: does combining the slot margin with the exit's own confidence, or
the softmax mass on the phone's own slots, gate better than the slot margin alone? Over a benchmark's finished HARMONY runs, each phone's
accuracy-vs-fallback curve for candidate scores computed on the phone from what it holds (its exit
logits, the server's slot prototypes, which slots are its own and which class each own slot is);
validation picks, test confirms. Nothing is retrained; the runs' files must be on disk.

    python benchmarks/gate_combos.py --runs-under benchmarks/results/fashion/work/eval \
        --method harmony --report benchmarks/results/gate_combos
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

from harmony_mobile.bench import gates
from harmony_mobile.bench.saved_runs import load_finished_run
from harmony_mobile.evaluation import client_answers

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling script
from gate_study import split_runs_under  # noqa: E402

WEIGHTS = (0.1, 0.25, 0.5, 1.0)
TEMPERATURES = (0.05, 0.1)
SHOWN = (0.1, 0.2, 0.3, 0.5)
OWN_SLOT_CLASS: dict[int, torch.Tensor] = {}  # id(SlotGate) -> exit index of each slot


def candidate_scores(exit_logits, features, prototypes) -> dict:
    """Higher = keep on the phone. `agree`: the exit's answer is the class of the nearest own slot."""
    gate = prototypes.slot_gate
    probability = exit_logits.softmax(dim=1)
    max_softmax = probability.amax(dim=1)
    cosine = F.normalize(features.flatten(1), dim=1) @ gate.prototypes.T
    present = gate.prototypes.abs().sum(dim=1) > 0
    own_cosine = cosine.masked_fill(~(gate.own_slots & present), -2.0)
    margin = gate.score(features)
    nearest_class = OWN_SLOT_CLASS[id(gate)][own_cosine.argmax(dim=1)]
    disagree = (nearest_class != exit_logits.argmax(dim=1)).float()
    scores = {
        "max_softmax": max_softmax,
        "slot_margin": margin,
        "margin, disagreeing last": margin - 4 * disagree,
    }
    for temperature in TEMPERATURES:  # the softmax mass the phone's own slots take among all slots
        logits = (cosine / temperature).masked_fill(~present, float("-inf"))
        own_mass = logits.softmax(dim=1).masked_fill(~gate.own_slots, 0.0).sum(dim=1)
        scores[f"own-slot mass, T {temperature}"] = own_mass
    for w in WEIGHTS:
        scores[f"margin + {w} max_softmax"] = margin + w * max_softmax
        scores[f"margin + {w} log max_softmax"] = margin + w * max_softmax.clamp_min(1e-6).log()
    return {name: value.numpy() for name, value in scores.items()}


def slot_gates_knowing_classes(backend, slot_tokens, replay, clients):
    made = SLOT_GATES(backend, slot_tokens, replay, clients)
    for gate, client in zip(made, clients, strict=True):
        OWN_SLOT_CLASS[id(gate)] = client.slot_to_class(slot_tokens)
    return made


SLOT_GATES = gates.slot_gates


def study(path: Path) -> dict:
    """The study harness's curves of one run, its scores the candidates: it computes them through
    these two names, replaced for this call only."""
    run = load_finished_run(path)
    answers = client_answers(run.clients, run.served, run.images)
    with (
        mock.patch.object(gates, "gate_scores", candidate_scores),
        mock.patch.object(gates, "slot_gates", slot_gates_knowing_classes),
    ):
        return gates.gate_studies(
            answers, run.served, run.labels, run.partition, run.seed, run.exit_rule, run.replay
        )


def mean_curves(runs: list[dict], on: str) -> tuple[dict, dict, float]:
    curves, aurocs, server = {}, {}, []
    for run in runs:
        rows = [row for key, row in run[on].items() if key.startswith("p=")]
        server.append(np.mean([row["server_only"] for row in rows]))
        for name in rows[0]["curve"]:
            curves.setdefault(name, []).append(np.mean([row["curve"][name] for row in rows], axis=0))
            aurocs.setdefault(name, []).append(np.mean([row["auroc"][name] for row in rows]))
    return curves, aurocs, float(np.mean(server))


def table(runs: list[dict], on: str) -> list[str]:
    curves, aurocs, server = mean_curves(runs, on)
    grid = list(gates.FALLBACK_GRID)
    at = [grid.index(rate) for rate in SHOWN]
    lines = [
        f"{on}: server only {100 * server:.1f}",
        "",
        "| score | " + " | ".join(f"{int(100 * r)}%" for r in SHOWN) + " | OOD AUROC |",
        "|---|" + "---|" * (len(SHOWN) + 1),
    ]
    ranked = sorted(curves, key=lambda name: -np.mean(curves[name], axis=0)[at[-1]])
    for name in ranked:
        mean = 100 * np.mean(curves[name], axis=0)
        cells = " | ".join(f"{mean[i]:.1f}" for i in at)
        lines.append(f"| {name} | {cells} | {np.mean(aurocs[name]):.3f} |")
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs-under", type=Path, required=True)
    parser.add_argument("--method", default="harmony")
    parser.add_argument("--report", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    studied = {}
    for path in split_runs_under(args.runs_under, args.method):
        studied.setdefault(path.parent.parent.name, []).append(study(path))
    lines = [
        "# Slot margin against its combinations and the own-slot softmax mass (evaluation only)",
        "",
        f"`python benchmarks/gate_combos.py --runs-under {args.runs_under} --method {args.method}` over "
        f"the saved `{args.method}` runs; accuracy with OOD (mean of p = 0.2 and 0.5) when each phone "
        "falls back the given share of its samples, lowest score first; mean over seeds, rows ranked "
        "by the 50 % column. Validation picks; test confirms.",
        "",
    ]
    for setting, runs in studied.items():
        lines += [f"## {setting} ({len(runs)} seeds)", ""] + table(runs, "val") + table(runs, "test")
    args.report.mkdir(parents=True, exist_ok=True)
    (args.report / "report.md").write_text("\n".join(lines))
    (args.report / "study.json").write_text(json.dumps(studied) + "\n")


if __name__ == "__main__":
    main()
