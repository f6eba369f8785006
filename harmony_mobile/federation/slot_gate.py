"""The slot gate: a phone exits locally when a sample sits nearer one of its own slots than any
other phone's (docs/ALGORITHM.md, section 8).

The server makes one prototype per slot from what it already holds, its back-end and the
label-free replay set, so nothing new leaves a phone and nothing new reaches the server; the phone
knows which slots are its own from its secret. A sample of a class the phone never saw sits nearer
another phone's slot, which max softmax over the phone's own exits cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harmony_mobile.protocol.slot_gate import slot_margin


@dataclass
class SlotGate:
    """What a phone gates by: the server's slot prototypes (slots, interface size) in slot order,
    and which of those slots are its own."""

    prototypes: torch.Tensor
    own_slots: torch.Tensor  # bool per slot

    def score(self, features: torch.Tensor) -> torch.Tensor:
        return slot_margin(features, self.prototypes, self.own_slots)


@torch.no_grad()
def slot_prototypes(backend: torch.nn.Module, slots: int, replay: torch.Tensor) -> torch.Tensor:
    """Server side: the unit-norm mean of the replay features the back-end puts in each slot, in
    slot order; a slot no row falls in stays zero."""
    features = replay.float()
    slot = backend(features)[:, :slots].argmax(dim=1)
    sums = torch.zeros(slots, features[0].numel())
    sums.index_add_(0, slot, F.normalize(features.flatten(1), dim=1))
    return F.normalize(sums, dim=1)


def slot_gates(
    backend: torch.nn.Module, slot_tokens: list[bytes], replay: torch.Tensor, clients: list
) -> list[SlotGate]:
    """Each client's gate: the server's prototypes (`slot_prototypes`) and the client's own slots,
    which only it can tell from the tokens (`own_slots`, from its secret)."""
    prototypes = slot_prototypes(backend, len(slot_tokens), replay)
    return [SlotGate(prototypes, client.own_slots(slot_tokens)) for client in clients]
