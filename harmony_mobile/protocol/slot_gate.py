"""The slot gate's score: what a phone computes to decide whether a sample is one of its own
classes, from the server's slot prototypes and the slots its secret names as its own
(docs/ALGORITHM.md, section 8). Phones in every language compute it the same way:
tests/vectors/slot_gate_decisions.json holds cases computed here.

A prototype is a unit-norm row per slot, in slot order; an all-zero row is a slot without one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def slot_margin(features: torch.Tensor, prototypes: torch.Tensor, own_slots: torch.Tensor) -> torch.Tensor:
    """Phone side: how much closer each row of `features` is to the nearest of the phone's own
    slots' prototypes than to the nearest other slot's (cosine; higher = surer it is the phone's
    own class), in [-2, 2]. Slots without a prototype take no part; a side with none counts as -1,
    the least cosine (a phone whose own slots have no prototype ranks samples by their distance
    from the others alone)."""
    cosine = F.normalize(features.flatten(1), dim=1) @ prototypes.T
    present = prototypes.abs().sum(dim=1) > 0
    own = cosine.masked_fill(~(own_slots & present), -2.0).amax(dim=1).clamp(min=-1.0)
    other = cosine.masked_fill(~(~own_slots & present), -2.0).amax(dim=1).clamp(min=-1.0)
    return own - other
