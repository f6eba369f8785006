"""Scratch screen, kept: slot prototypes the server distils from its back-end instead of averaging.

The slot gate compares a phone's feature with one prototype per slot (cosine); the server makes
them from what it holds, its back-end and the 512-row replay set, as the unit-norm mean of the rows
the back-end puts in each slot. Here the server instead fits the prototypes as a cosine classifier
(logits = s x cos(row, prototype), s learned) to the back-end's own slot distribution on the same
rows (KL, Adam, 300 full-batch steps, started from the means): the prototypes then point where the
back-end draws its slot boundaries, not at the slots' centres. Nothing else changes: the same
rows, the same score on the phone, the same file shipped. Over a finished run's saved files, both
kinds of prototypes, the phones recalibrated to the run's target and evaluated; one line per run
and kind, then `--compare` pairs them.

    python benchmarks/results/fashion-finish-screens/distilled_prototypes.py \
        benchmarks/results/fashion/work/eval > distilled_rows.jsonl
    python benchmarks/results/fashion-finish-screens/distilled_prototypes.py --compare distilled_rows.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

from harmony_mobile.bench.saved_runs import load_finished_run
from harmony_mobile.bench.stats import paired_ci
from harmony_mobile.evaluation import client_answers
from harmony_mobile.federation import slot_gate

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling screen
from replay_rows import gated_row  # noqa: E402

MEAN_PROTOTYPES = slot_gate.slot_prototypes


@torch.no_grad()
def backend_slot_distribution(backend, slots: int, rows: torch.Tensor) -> torch.Tensor:
    return backend(rows)[:, :slots].log_softmax(dim=1)


def distilled_prototypes(backend, slots: int, replay: torch.Tensor, steps: int = 300) -> torch.Tensor:
    """Unit-norm prototypes whose scaled cosines reproduce the back-end's slot distribution on the
    replay rows; a slot no row falls in stays zero, as with the means."""
    rows = replay.float()
    means = MEAN_PROTOTYPES(backend, slots, rows)
    present = means.abs().sum(dim=1) > 0
    target = backend_slot_distribution(backend, slots, rows).masked_fill(~present, -1e4).log_softmax(dim=1)
    flat = F.normalize(rows.flatten(1), dim=1)
    prototypes = torch.nn.Parameter(means.clone())
    log_scale = torch.nn.Parameter(torch.tensor(2.3))  # s = 10 to start
    optimizer = torch.optim.Adam([prototypes, log_scale], lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        logits = log_scale.exp() * flat @ F.normalize(prototypes, dim=1).T
        predicted = logits.masked_fill(~present, -1e4).log_softmax(dim=1)
        F.kl_div(predicted, target, log_target=True, reduction="batchmean").backward()
        optimizer.step()
    return F.normalize(prototypes.detach(), dim=1).masked_fill(~present[:, None], 0.0)


def one_kind(run, answers, kind: str) -> dict:
    make = {"mean": MEAN_PROTOTYPES, "distilled": distilled_prototypes}[kind]
    with mock.patch.object(slot_gate, "slot_prototypes", make):
        return gated_row(run, answers, run.replay, rates=(0.1, 0.3, 0.5))


def compare(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    by_run = {}
    for row in rows:
        by_run.setdefault(row["run"], {})[row["kind"]] = row
    for setting in sorted({run.split("/")[0] for run in by_run}):
        pairs = [kinds for run, kinds in by_run.items() if run.startswith(setting + "/")]
        print(f"{setting} ({len(pairs)} runs): distilled - mean, mean [95 % t CI]; then distilled's gap")
        for key in ("acc_with_ood", "val10", "val30", "val50", "test10", "test30", "test50", "testauroc"):
            ci = paired_ci([100 * (p["distilled"][key] - p["mean"][key]) for p in pairs])
            print(f"  {key}: {ci['mean']:+.2f} [{ci['low']:+.2f}, {ci['high']:+.2f}]")
        for kind in ("mean", "distilled"):
            for on in ("val", "test"):
                gap = np.mean([100 * (p[kind][on + "server"] - p[kind][on + "50"]) for p in pairs])
                print(f"  {kind} {on}: server only - hybrid at 50 % = {gap:.2f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "--compare":
        compare(Path(sys.argv[2]))
        sys.exit()
    for path in sorted(Path(sys.argv[1]).glob("fashion-*/harmony/seed-*")):
        if not (path / "backend.pt").is_file():
            continue
        run = load_finished_run(path)
        answers = client_answers(run.clients, run.served, run.images)
        for kind in ("mean", "distilled"):
            line = {
                "run": f"{path.parent.parent.name}/{path.name}",
                "kind": kind,
                **one_kind(run, answers, kind),
            }
            print(json.dumps(line), flush=True)
