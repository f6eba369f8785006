"""Scratch screen, kept: `benchmarks/gate_combos.py`'s harness with slot margins over several
centres instead of one prototype per slot. The kNN screen (`gate_knn.py`) gained half a point
from a bank of all the phone's own training features (37 MB); centres are a bank a phone can keep.

- `server centres M`: the server splits each slot's replay features into M spherical k-means
  centres (from what it already holds; M x slots rows reach each phone); the margin is the nearest
  own centre against the nearest foreign one.
- `phone centres M minus foreign`: the phone clusters its own training features into M centres
  (never leaving it) against the server's nearest foreign slot prototype.

    python benchmarks/results/fashion-finish-screens/gate_centres.py \
        --runs-under benchmarks/results/fashion/work/eval --method harmony --report OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import gate_combos  # noqa: E402

SERVER_CENTRES = (2, 4, 8)
PHONE_CENTRES = (16, 64, 256)
SERVER: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}  # gate -> M -> (centres, slot)
PHONE: dict[int, dict[int, torch.Tensor]] = {}  # gate -> M -> the phone's own centres
DEFAULT_GATES = gate_combos.slot_gates_knowing_classes


def spherical_kmeans(rows: torch.Tensor, centres: int, iterations: int = 20) -> torch.Tensor:
    """Unit-norm centres of unit-norm rows (cosine k-means), seeded: the same rows give the same centres."""
    if len(rows) <= centres:
        return rows.clone()
    pick = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0))[:centres]
    means = rows[pick].clone()
    for _ in range(iterations):
        nearest = (rows @ means.T).argmax(dim=1)
        sums = torch.zeros_like(means).index_add_(0, nearest, rows)
        empty = sums.abs().sum(dim=1) == 0
        means = torch.where(empty[:, None], means, F.normalize(sums, dim=1))
    return means


def server_centres(backend, slots: int, replay: torch.Tensor, per_slot: int):
    """Each slot's replay rows (as the slot prototypes assign them) split into `per_slot` centres."""
    features = replay.float()
    slot = backend(features)[:, :slots].argmax(dim=1)
    flat = F.normalize(features.flatten(1), dim=1)
    centres, owner = [], []
    for s in range(slots):
        rows = flat[slot == s]
        if len(rows):
            made = spherical_kmeans(rows, per_slot)
            centres.append(made)
            owner.append(torch.full((len(made),), s))
    return torch.cat(centres), torch.cat(owner)


def nearest(cosine: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return cosine.masked_fill(~mask, -2.0).amax(dim=1).clamp(min=-1.0)


def candidate_scores(exit_logits, features, prototypes) -> dict:
    gate, flat = prototypes.slot_gate, F.normalize(features.flatten(1), dim=1)
    present = gate.prototypes.abs().sum(dim=1) > 0
    foreign = nearest(flat @ gate.prototypes.T, ~gate.own_slots & present)
    scores = {"slot_margin": gate.score(features)}
    for m, (centres, owner) in SERVER[id(gate)].items():
        cosine, own = flat @ centres.T, gate.own_slots[owner]
        scores[f"server centres {m}"] = nearest(cosine, own) - nearest(cosine, ~own)
        scores[f"server centres {m}, one foreign prototype"] = nearest(cosine, own) - foreign
    for m, centres in PHONE[id(gate)].items():
        scores[f"phone centres {m} minus foreign"] = (flat @ centres.T).amax(dim=1) - foreign
    return {name: value.numpy() for name, value in scores.items()}


@torch.no_grad()
def gates_with_centres(backend, slot_tokens, replay, clients):
    made = DEFAULT_GATES(backend, slot_tokens, replay, clients)
    server = {m: server_centres(backend, len(slot_tokens), replay, m) for m in SERVER_CENTRES}
    for gate, client in zip(made, clients, strict=True):
        parts = torch.cat([client.model(x, client.split_depth)[1] for x in client.train_x.split(512)])
        own = F.normalize(parts.flatten(1), dim=1)
        SERVER[id(gate)] = server
        PHONE[id(gate)] = {m: spherical_kmeans(own, m) for m in PHONE_CENTRES}
    return made


if __name__ == "__main__":
    gate_combos.candidate_scores = candidate_scores
    gate_combos.slot_gates_knowing_classes = gates_with_centres
    gate_combos.main()
