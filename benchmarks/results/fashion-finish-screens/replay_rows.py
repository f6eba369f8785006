"""Scratch screen, kept: the slot gate with a larger replay set. The server's slot prototypes come
from the replay set (512 rows in all); over a finished run's saved files, the phones' replay shares
are drawn again at other sizes (the same draw at 512 reproduces the saved set, checked), the phones
recalibrated to the run's target and evaluated. One line per run and size on stdout.

    python benchmarks/results/fashion-finish-screens/replay_rows.py \
        benchmarks/results/fashion/work/eval 512,2048,8192 > replay_rows.log
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from harmony_mobile import training
from harmony_mobile.bench import gates
from harmony_mobile.bench.saved_runs import load_finished_run
from harmony_mobile.evaluation import EvaluationSetting, client_answers, evaluate
from harmony_mobile.federation.replay import collect_replay

CALIBRATION_TARGET = 0.98  # the fashion profile's


def one_size(run, answers, rows: int) -> dict:
    replay = collect_replay(run.clients, run.seed, rows)
    if rows == len(run.replay):
        assert torch.equal(replay, run.replay), "the draw does not reproduce the saved replay set"
    return gated_row(run, answers, replay)


def gated_row(run, answers, replay: torch.Tensor, rates: tuple[float, ...] = (0.5,)) -> dict:
    """The run's phones gated by the slot prototypes made from `replay`, recalibrated and evaluated:
    accuracy with OOD, and on val / test the curve at `rates`, server-only accuracy and OOD AUROC."""
    backend, tokens = run.served.backend, run.served.slot_tokens
    training.gate_clients(run.clients, backend, tokens, replay, CALIBRATION_TARGET)
    setting = EvaluationSetting(run.images, run.labels, run.partition, run.seed, "slot_margin")
    results = evaluate(run.clients, run.served, setting, answers)
    study = gates.gate_studies(
        answers, run.served, run.labels, run.partition, run.seed, "slot_margin", replay
    )
    row = {"acc_with_ood": results["summary"]["accuracy_with_ood"]}
    for on in ("val", "test"):
        parts = [value for key, value in study[on].items() if key.startswith("p=")]
        for rate in rates:
            index = gates.FALLBACK_GRID.index(rate)
            curve = [p["curve"]["slot_margin"][index] for p in parts]
            row[f"{on}{int(100 * rate)}"] = float(np.mean(curve))
        row[on + "server"] = float(np.mean([p["server_only"] for p in parts]))
        row[on + "auroc"] = float(np.mean([p["auroc"]["slot_margin"] for p in parts]))
    return row


if __name__ == "__main__":
    torch.set_num_threads(1)
    sizes = [int(size) for size in sys.argv[2].split(",")]
    for path in sorted(Path(sys.argv[1]).glob("fashion-*/harmony/seed-*")):
        if not (path / "backend.pt").is_file():
            continue
        run = load_finished_run(path)
        answers = client_answers(run.clients, run.served, run.images)
        for rows in sizes:
            print(
                json.dumps(
                    {
                        "run": f"{path.parent.parent.name}/{path.name}",
                        "rows": rows,
                        **one_size(run, answers, rows),
                    }
                ),
                flush=True,
            )
