"""Scratch screen, kept: `benchmarks/gate_combos.py`'s harness with nearest-neighbour scores
(deep kNN OOD detection): each phone keeps its own training samples' normalized features and
scores a sample by the cosine of its k-th nearest one, alone or against the nearest foreign slot
prototype, or averaged in rank with the slot margin. Everything is computed on the phone from what
it holds (its own features, the server's slot prototypes, which slots are its own).

    python benchmarks/results/fashion-finish-screens/gate_knn.py \
        --runs-under benchmarks/results/fashion/work/eval --method harmony --report OUT [--small]

`--small`: k = 10 against the nearest foreign prototype from banks a phone can afford (fewer rows,
features pooled to 2 x 2).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from scipy.stats import rankdata

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import gate_combos  # noqa: E402

BANK: dict[int, torch.Tensor] = {}  # id(SlotGate) -> the phone's own normalized training features
SMALL: dict[int, torch.Tensor] = {}  # id(SlotGate) -> the same features pooled to 2 x 2
NEIGHBOURS = (1, 10, 50)
SMALL_ROWS = 256  # `--small`: a bank a phone can afford, these many rows of 2 x 2 pooled features
DEFAULT_GATES = gate_combos.slot_gates_knowing_classes


def kth_nearest(flat: torch.Tensor, bank: torch.Tensor) -> dict[int, torch.Tensor]:
    """Cosine of each row's k-th nearest bank row, for every k in NEIGHBOURS."""
    top = torch.cat([(chunk @ bank.T).topk(max(NEIGHBOURS), dim=1).values for chunk in flat.split(512)])
    return {k: top[:, k - 1] for k in NEIGHBOURS}


def rank(values: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(rankdata(values.numpy()) / len(values))


def nearest_foreign(gate, flat: torch.Tensor) -> torch.Tensor:
    """Cosine of each normalized row's nearest slot prototype that is not the phone's own."""
    present = gate.prototypes.abs().sum(dim=1) > 0
    cosine = flat @ gate.prototypes.T
    return cosine.masked_fill(~(~gate.own_slots & present), -2.0).amax(dim=1).clamp(min=-1.0)


def pooled(features: torch.Tensor) -> torch.Tensor:
    return F.normalize(F.adaptive_avg_pool2d(features, 2).flatten(1), dim=1)


def small_bank_scores(exit_logits, features, prototypes) -> dict:
    """k = 10 against the nearest foreign prototype, from the full bank and from smaller ones."""
    gate, flat = prototypes.slot_gate, F.normalize(features.flatten(1), dim=1)
    foreign = nearest_foreign(gate, flat)
    bank, small, pooled_flat = BANK[id(gate)], SMALL[id(gate)], pooled(features)
    rows = torch.randperm(len(bank), generator=torch.Generator().manual_seed(0))[:SMALL_ROWS]
    scores = {"slot_margin": gate.score(features)}
    scores["kNN k=10 minus foreign"] = kth_nearest(flat, bank)[10] - foreign
    scores[f"kNN k=10 minus foreign, {SMALL_ROWS} rows"] = kth_nearest(flat, bank[rows])[10] - foreign
    scores["kNN k=10 minus foreign, pooled 2x2"] = kth_nearest(pooled_flat, small)[10] - foreign
    scores[f"kNN k=10 minus foreign, pooled 2x2, {SMALL_ROWS} rows"] = (
        kth_nearest(pooled_flat, small[rows])[10] - foreign
    )
    return {name: value.numpy() for name, value in scores.items()}


def candidate_scores(exit_logits, features, prototypes) -> dict:
    gate, flat = prototypes.slot_gate, F.normalize(features.flatten(1), dim=1)
    foreign = nearest_foreign(gate, flat)
    margin = gate.score(features)
    scores = {"slot_margin": margin}
    for k, near in kth_nearest(flat, BANK[id(gate)]).items():
        scores[f"kNN k={k}"] = near
        scores[f"kNN k={k} minus foreign"] = near - foreign
        scores[f"rank mean of margin and kNN k={k}"] = rank(margin) + rank(near)
    return {name: value.numpy() for name, value in scores.items()}


@torch.no_grad()
def gates_with_bank(backend, slot_tokens, replay, clients):
    made = DEFAULT_GATES(backend, slot_tokens, replay, clients)
    for gate, client in zip(made, clients, strict=True):
        parts = torch.cat([client.model(x, client.split_depth)[1] for x in client.train_x.split(512)])
        BANK[id(gate)] = F.normalize(parts.flatten(1), dim=1)
        SMALL[id(gate)] = pooled(parts)
    return made


if __name__ == "__main__":
    small = "--small" in sys.argv
    if small:
        sys.argv.remove("--small")
    gate_combos.candidate_scores = small_bank_scores if small else candidate_scores
    gate_combos.slot_gates_knowing_classes = gates_with_bank
    gate_combos.main()
