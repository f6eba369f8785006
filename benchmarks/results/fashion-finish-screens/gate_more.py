"""Scratch screen, kept: `benchmarks/gate_combos.py`'s harness with other candidate scores, each
computed on the phone from what it holds (its features, its own exits' mean features, the server's
slot prototypes, which slots are its own, a per-dimension scale of its own training features).

    python benchmarks/results/fashion-finish-screens/gate_more.py \
        --runs-under benchmarks/results/fashion/work/eval --method harmony --report OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import gate_combos  # noqa: E402

SCALE: dict[int, torch.Tensor] = {}  # id(SlotGate) -> per-dimension std of the phone's own features
DEFAULT_GATES = gate_combos.slot_gates_knowing_classes


def nearest(cosine: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return cosine.masked_fill(~mask, -2.0).amax(dim=1).clamp(min=-1.0)


def candidate_scores(exit_logits, features, prototypes) -> dict:
    gate = prototypes.slot_gate
    flat = F.normalize(features.flatten(1), dim=1)
    present = gate.prototypes.abs().sum(dim=1) > 0
    own, other = gate.own_slots & present, ~gate.own_slots & present
    cosine = flat @ gate.prototypes.T
    own_server, foreign = nearest(cosine, own), nearest(cosine, other)
    own_phone = (flat @ prototypes.own.T).amax(dim=1)
    top3 = cosine.masked_fill(~other, -2.0).topk(3, dim=1).values.clamp(min=-1.0).mean(dim=1)
    scale = SCALE[id(gate)]
    white = F.normalize(features.flatten(1) / scale, dim=1) @ (F.normalize(gate.prototypes / scale, dim=1)).T
    scores = {
        "slot_margin": own_server - foreign,
        "phone-own minus foreign": own_phone - foreign,
        "mean own minus foreign": 0.5 * (own_phone + own_server) - foreign,
        "own minus mean top3 foreign": own_server - top3,
        "whitened margin": nearest(white, own) - nearest(white, other),
    }
    return {name: value.numpy() for name, value in scores.items()}


def gates_with_scale(backend, slot_tokens, replay, clients):
    made = DEFAULT_GATES(backend, slot_tokens, replay, clients)
    for gate, client in zip(made, clients, strict=True):
        with torch.no_grad():
            _, z = client.model(client.train_x[:1024], client.split_depth)
        std = z.flatten(1).std(dim=0)
        SCALE[id(gate)] = std + 1e-3 * std.mean()
    return made


if __name__ == "__main__":
    gate_combos.candidate_scores = candidate_scores
    gate_combos.slot_gates_knowing_classes = gates_with_scale
    gate_combos.main()
