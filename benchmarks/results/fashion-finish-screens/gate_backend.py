"""Scratch screen, kept: the upper bound for a gate from the back-end. `benchmarks/gate_combos.py`'s
harness with scores a phone cannot compute: the back-end's own softmax mass on the phone's slots,
its top own logit against its top foreign one, and the slot margin plus w x the latter.

    python benchmarks/results/fashion-finish-screens/gate_backend.py \
        --runs-under RUNS --method harmony --report OUT
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import gate_combos

BACKEND = {}


def candidate_scores(exit_logits, features, prototypes):
    gate = prototypes.slot_gate
    backend, slots = BACKEND[id(gate)]
    with torch.no_grad():
        logits = backend(features.float())[:, :slots]
    own = gate.own_slots
    lp = logits.log_softmax(dim=1)
    scores = {"slot_margin": gate.score(features)}
    scores["g own mass"] = lp.masked_fill(~own, float("-inf")).logsumexp(dim=1)
    scores["g own max - foreign max"] = logits.masked_fill(~own, -1e9).amax(1) - logits.masked_fill(
        own, -1e9
    ).amax(1)
    m = gate.score(features)
    for w in (0.01, 0.03, 0.1):
        scores[f"margin + {w} g-logit margin"] = m + w * scores["g own max - foreign max"]
    return {k: v.float().numpy() for k, v in scores.items()}


def hook(backend, slot_tokens, replay, clients):
    made = gate_combos.SLOT_GATES(backend, slot_tokens, replay, clients)
    for g in made:
        BACKEND[id(g)] = (backend, len(slot_tokens))
    return made


gate_combos.candidate_scores = candidate_scores
gate_combos.slot_gates_knowing_classes = hook
gate_combos.main()
