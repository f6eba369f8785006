"""Scratch screen, kept: `benchmarks/gate_combos.py`'s harness with Gaussian (Mahalanobis) scores
a phone can afford. Each phone fits one Gaussian per own class on its own training features,
average-pooled to P x P, with one shared (Ledoit-Wolf shrunk) covariance; it scores a sample by
the distance to its nearest own class (`gauss own`), that against the nearest foreign slot's mean
under the same covariance (`minus foreign`; the server would ship pooled slot means made from the
replay set, as it ships the prototypes), or relative to one Gaussian over all its features
(`relative`). A P = 2 model is C*4 means per class and a (C*4)^2 precision: 256 KB at C = 64,
against the 37 MB bank of the kNN screen. Everything but the foreign means is the phone's own.

    python benchmarks/results/fashion-finish-screens/gate_gauss.py \
        --runs-under benchmarks/results/fashion/work/eval --method harmony --report OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from sklearn.covariance import LedoitWolf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import gate_combos  # noqa: E402

POOLS = (1, 2)
MODELS: dict[
    int, dict
] = {}  # id(SlotGate) -> {pool: (own means, foreign means, precision, mean, precision all)}
DEFAULT_GATES = gate_combos.SLOT_GATES


def pooled(features: torch.Tensor, pool: int) -> torch.Tensor:
    return F.adaptive_avg_pool2d(features.float(), pool).flatten(1).double()


def squared_distances(rows: torch.Tensor, means: torch.Tensor, precision: torch.Tensor) -> torch.Tensor:
    diff = rows[:, None, :] - means[None, :, :]
    return torch.einsum("nkd,de,nke->nk", diff, precision, diff)


def fit(own: torch.Tensor, labels: torch.Tensor, foreign: torch.Tensor) -> tuple:
    classes = labels.unique()
    means = torch.stack([own[labels == c].mean(dim=0) for c in classes])
    centred = own - means[torch.searchsorted(classes, labels)]
    precision = torch.from_numpy(LedoitWolf(assume_centered=True).fit(centred.numpy()).precision_)
    everything = LedoitWolf().fit(own.numpy())
    return (
        means,
        foreign,
        precision,
        torch.from_numpy(everything.location_)[None],
        torch.from_numpy(everything.precision_),
    )


def candidate_scores(exit_logits, features, prototypes) -> dict:
    gate = prototypes.slot_gate
    scores = {"slot_margin": gate.score(features)}
    for pool, (means, foreign, precision, centre, precision_all) in MODELS[id(gate)].items():
        rows = pooled(features, pool)
        own = squared_distances(rows, means, precision).amin(dim=1)
        scores[f"gauss own, pool {pool}"] = -own
        nearest_foreign = (  # a phone holding every slot has no foreign one to be near
            squared_distances(rows, foreign, precision).amin(dim=1) if len(foreign) else 0.0
        )
        scores[f"gauss own minus foreign, pool {pool}"] = nearest_foreign - own
        scores[f"relative gauss, pool {pool}"] = squared_distances(rows, centre, precision_all)[:, 0] - own
    return {name: value.float().numpy() for name, value in scores.items()}


@torch.no_grad()
def gates_with_gaussians(backend, slot_tokens, replay, clients):
    made = DEFAULT_GATES(backend, slot_tokens, replay, clients)
    replay_slot = backend(replay.float())[:, : len(slot_tokens)].argmax(dim=1)
    slots = replay_slot.unique()
    slot_means = {}  # what the server would ship: each slot's pooled replay mean, once for every phone
    for pool in POOLS:
        rows = pooled(replay, pool)
        slot_means[pool] = torch.stack([rows[replay_slot == s].mean(dim=0) for s in slots])
    for gate, client in zip(made, clients, strict=True):
        parts = torch.cat([client.model(x, client.split_depth)[1] for x in client.train_x.split(512)])
        foreign = ~gate.own_slots[slots]  # may be none: a phone holding every slot
        MODELS[id(gate)] = {
            pool: fit(pooled(parts, pool), client.train_y, slot_means[pool][foreign]) for pool in POOLS
        }
    return made


if __name__ == "__main__":
    gate_combos.candidate_scores = candidate_scores
    gate_combos.slot_gates_knowing_classes = gates_with_gaussians
    gate_combos.main()
